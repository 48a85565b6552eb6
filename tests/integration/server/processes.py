"""Process helpers of the fault tests: follow the processes a test started, end them by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (the Ray processes under a server)."""
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def reap(pids: set[int], grace: float = 30.0) -> list[int]:
    """Wait up to ``grace`` s for ``pids`` (started by this test) to exit; SIGKILL the rest.

    Returns the pids that had to be killed.
    """
    deadline = time.monotonic() + grace
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    killed = alive(pids)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def kill_loop_after_fwd_bwd(command: list[str], log_file: Path, step: int) -> None:
    """Run the fault loop ``command`` and SIGKILL it once it logged ``fwd_bwd`` of ``step``
    (before its ``step``); the loop holds there until killed, so the kill always lands there."""
    marker = f'"i": {step}, "phase": "fwd_bwd"'
    env = {**os.environ, "LOOP_HOLD_AFTER_FWD_BWD": str(step)}
    process = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 120
        while marker not in (log_file.read_text() if log_file.exists() else ""):
            assert process.poll() is None, "the loop process ended before it was killed"
            assert time.monotonic() < deadline, f"the loop never logged {marker}"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
