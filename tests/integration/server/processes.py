"""The fault tests' loop killer (following and reaping processes is ``support.servers``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


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
