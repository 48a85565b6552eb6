"""Killing a job's worker the way a crash would, for the restart tests of this folder."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def kill_worker_and_wait_failed(client: Any, job_type: str, timeout: float = 60.0) -> None:
    """SIGKILL the first worker of ``client``'s ``job_type`` job and wait until the server
    reads the job ``failed`` for it."""
    info = client.job_info(job_type)
    os.kill(info["worker_pids"][0], signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while info["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.5)
        info = client.job_info(job_type)
    assert info["state"] == "failed" and "died" in info["reason"], info
