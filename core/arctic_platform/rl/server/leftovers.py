"""Processes a stopped Ray cluster of ours left behind, found and ended by PID.

A worker whose main thread is blocked (seen: a restarted DeepSpeed training worker) can
outlive ``ray.kill`` and its raylet; ``ray.shutdown`` then returns with the worker orphaned.
The server lists the Ray processes it started (and everything under them) before it stops a
cluster it started, and ends what is still there afterwards. Linux only (``/proc``); elsewhere
nothing is listed.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)

# (pid, start time in clock ticks since boot): a pid taken again by a new process is not ours
Process = tuple[int, int]


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def _children() -> dict[int, list[Process]]:
    """Every live process, by parent pid (one pass over /proc)."""
    children: dict[int, list[Process]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return children
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[1] != "Z":
            children.setdefault(stat[0], []).append((int(entry.name), stat[2]))
    return children


def _under(children: dict[int, list[Process]], roots: list[Process]) -> list[Process]:
    """``roots`` and every process under them."""
    out: list[Process] = []
    todo = list(roots)
    while todo:
        process = todo.pop()
        out.append(process)
        todo += children.get(process[0], [])
    return out


def descendants(pid: int) -> list[Process]:
    """Every live process under ``pid`` (children, their children, ...)."""
    children = _children()
    return _under(children, children.get(pid, []))


def _is_ray(pid: int) -> bool:
    """Whether ``pid`` is a process of Ray's (its binaries and scripts, or a ``ray::`` worker)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[0].startswith(b"ray::") or any(b"/ray/" in arg for arg in argv[:3])


def ray_processes(pid: int) -> list[Process]:
    """The Ray processes ``pid`` started (its children that are Ray's) and all under them;
    other children of ``pid`` (a user's own) and theirs are left out."""
    children = _children()
    return _under(children, [c for c in children.get(pid, []) if _is_ray(c[0])])


def _alive(process: Process) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[1] != "Z" and stat[2] == process[1]


def end_leftovers(processes: list[Process], grace: float = 5.0) -> list[int]:
    """SIGKILL those of ``processes`` still running after ``grace`` seconds; their pids.

    Only the very processes listed (same pid and start time) are signalled.
    """
    deadline = time.monotonic() + grace
    left = [p for p in processes if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        logger.warning(
            "%d process(es) of the stopped Ray cluster outlived it; killed: %s",
            len(left),
            ", ".join(str(pid) for pid, _ in left),
        )
    return [pid for pid, _ in left]
