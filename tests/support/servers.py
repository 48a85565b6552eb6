"""Start ``arctic-rl`` servers as subprocesses, wait for them, and stop and reap them by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import httpx
import psutil

from arctic_platform.rl.network import accepts_connections


def arctic_rl(*args: str) -> list[str]:
    """The command line of ``arctic-rl ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "arctic_platform.rl.cli", *args]


def answers(url: str) -> Callable[[], bool]:
    """A probe: whether GET ``url`` answers 200 now."""

    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def tail(log: Path, chars: int = 3000) -> str:
    """The end of a log file (empty when it does not exist yet)."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``ready`` until it holds; fail naming ``what`` (and the log's end) when ``process``
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        where = f"\n--- {log} ---\n{tail(log)}" if log is not None else ""
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {process.returncode}{where}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not ready after {timeout:.0f} s{where}")
        time.sleep(0.5)


def wait_listening(port: int, thread: threading.Thread) -> None:
    """Wait until something listens on 127.0.0.1:``port`` (an in-process server started on
    ``thread``); fail when the thread ends first or nothing listens after about 20 s."""
    for _ in range(400):
        assert thread.is_alive(), "the server thread ended before it listened"
        if accepts_connections("127.0.0.1", port, 0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def spawn(
    command: list[str],
    log: Path,
    ready: Callable[[], bool],
    what: str,
    timeout: float = 180.0,
    env: Mapping[str, str] | None = None,
    new_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``command`` (output appended to ``log``) and wait until ``ready()``; a process
    that never gets ready is stopped and the failure names ``what``."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
            env=dict(env if env is not None else os.environ),
        )
    try:
        wait_until(ready, what, timeout, process, log)
    except BaseException:
        stop(process)
        raise
    return process


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (the Ray and worker processes under a server)."""
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap(pids: Iterable[int], grace: float = 30.0) -> list[int]:
    """Wait up to ``grace`` s for ``pids`` (started by this test) to exit; SIGKILL the rest.

    Returns the pids that had to be killed.
    """
    pids = set(pids)
    deadline = time.monotonic() + grace
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    stragglers = alive(pids)
    kill(stragglers)
    return stragglers


def stop(
    process: subprocess.Popen[bytes], grace: float = 90.0, reap_grace: float = 15.0
) -> list[int]:
    """SIGTERM ``process`` (a server closes its jobs and Ray), wait ``grace`` s, then reap its
    whole process tree, SIGKILLing what is left. Returns the pids that had to be killed."""
    if process.poll() is not None:
        return []
    tree = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    return reap(tree | descendants(process.pid), reap_grace)


def crash(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` and its whole tree at once (a machine losing the server)."""
    tree = descendants(process.pid)
    kill([process.pid, *tree])
    process.wait(timeout=30)
    reap(tree)
