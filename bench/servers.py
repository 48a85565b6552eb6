"""Servers a benchmark starts itself: ``python -m arctic_platform.rl.cli``, polled until healthy.

One process group each (so a stop that times out takes the server's children with it), the
output in a log file whose tail goes into the error when the server exits or never answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arctic_platform.rl.config import ArcticRLClientConfig


def start_server(
    args: Sequence[str],
    *,
    health_url: str,
    log: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> subprocess.Popen[bytes]:
    """Start ``arctic_platform.rl.cli`` with ``args``; return once ``health_url`` answers 2xx."""
    import httpx

    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "arctic_platform.rl.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(args[:2])} exited:\n{_tail(log)}")
        try:
            if httpx.get(health_url, timeout=2).is_success:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(process)
    raise RuntimeError(f"{' '.join(args[:2])} did not answer {health_url} in {timeout:.0f} s")


def stop_server(process: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL the server's whole process group."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {log})"


def loopback_config(model: str, port: int, **fields: Any) -> ArcticRLClientConfig:
    """The client config of a benchmark's own server on 127.0.0.1:``port`` (no Ray
    auto-attach, no server log in the client's output), with ``fields`` added."""
    from arctic_platform.rl.config import ArcticRLClientConfig

    return ArcticRLClientConfig(
        model_name=model,
        host="127.0.0.1",
        port=port,
        ray_auto_attach=False,
        server_logs=False,
        **fields,
    )
