"""``arctic-rl serve`` stopped by SIGTERM shuts down in order and exits 0 (both network
transports): Ray's own SIGTERM handler, put in when the server starts Ray, once made it
exit 1 saying the server "failed to start (15)"."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support import servers
from support.servers import arctic_rl

from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow

HEALTH = {"http": "/health", "tinker": "/api/v1/healthz"}


@pytest.mark.parametrize("transport", ["http", "tinker"])
def test_sigterm_stops_the_server_in_order_and_it_exits_0(transport: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tml-signal-test-0123456789")
    port = free_port()
    run_dir = tmp_path / "run"
    command = arctic_rl(
        "serve", "--transport", transport, "--host", "127.0.0.1", "--port", str(port),
        "--token-file", str(token), "--run-dir", str(run_dir), "--num-gpus", "1",
        "--no-ray-auto-attach",
    )  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ARCTIC_RL_HOME": str(tmp_path / "home")}
    log = tmp_path / "server.log"
    health = servers.answers(f"http://127.0.0.1:{port}{HEALTH[transport]}")
    what = f"the {transport} server's {HEALTH[transport]}"
    process = servers.spawn(command, log, health, what, env=env, new_session=False)
    try:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    finally:
        servers.stop(process)  # only if it is still running: then the test fails above
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "failed to start" not in text and "error:" not in text, text[-3000:]
    assert not (run_dir / "server.pid").exists()
