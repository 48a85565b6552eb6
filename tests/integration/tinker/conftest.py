"""A real ``arctic-rl serve --transport tinker`` on 127.0.0.1 over a tiny local model.

The server is a subprocess with its own Ray cluster (one logical GPU: the training and
sampling jobs of a model share it); tests talk to it with the real ``tinker`` SDK.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from arctic_platform.rl.testing import free_port

TOKEN = "tml-arctic-test-key"


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run this package's cookbook test after its SDK tests, in the same slots.

    The recipe's process exits without finishing its Tinker session, so its model's jobs keep
    the server's one logical GPU until the 120 s heartbeat timeout: run first, it made the SDK
    module wait those two minutes for placement; run last, the server's stop frees them.
    """
    slots = [i for i, item in enumerate(items) if Path(str(item.path)).resolve().parent == HERE]
    ours = [items[i] for i in slots]
    ours.sort(key=lambda item: Path(str(item.path)).name == "test_cookbook.py")
    for slot, item in zip(slots, ours, strict=True):
        items[slot] = item


@dataclass
class TinkerServer:
    """A running tinker server: its URL, key, model path and log."""

    base_url: str
    token: str
    model: str
    log: Path
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """The environment a tinker SDK process needs to reach this server."""
        return {**os.environ, "TINKER_BASE_URL": self.base_url, "TINKER_API_KEY": self.token}


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server (it closes its jobs and Ray), then SIGKILL what it left behind."""
    try:
        children = {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        children = set()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 30
    for pid in children:
        try:
            proc = psutil.Process(pid)
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def tinker_server(
    tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TinkerServer]:
    """One tinker server for the whole session (jobs start per model, on demand)."""
    run_dir = tmp_path_factory.mktemp("tinker-run")
    token_file = run_dir / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    log = run_dir / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ARCTIC_RL_HOME": str(run_dir / "home")}
    cmd = [
        sys.executable, "-m", "arctic_platform.rl.cli", "serve",
        "--transport", "tinker", "--host", "127.0.0.1", "--port", str(port),
        "--token-file", str(token_file), "--run-dir", str(run_dir / "server"),
        "--num-gpus", "1", "--no-ray-auto-attach",
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, f"the tinker server exited: {log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{base_url}/api/v1/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"no tinker server after 300 s: {log.read_text()}"
        time.sleep(0.5)
    try:
        yield TinkerServer(base_url, TOKEN, tiny_model_path, log, process)
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def service(tinker_server: TinkerServer) -> Iterator[object]:
    """A ``tinker.ServiceClient`` on the server; closing it finishes the session, which
    destroys its models' jobs (one logical GPU holds one model's jobs at a time)."""
    import tinker

    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.token)
    yield client
    client.close("success").result(timeout=300)


@pytest.fixture(scope="module")
def training(service: object, tinker_server: TinkerServer) -> object:
    """One training client (full fine-tuning of the tiny model) shared by a module's tests."""
    return service.create_lora_training_client(  # type: ignore[attr-defined]
        base_model=tinker_server.model, rank=8
    ).result(timeout=900)
