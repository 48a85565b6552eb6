"""A real ``arctic-rl serve --transport tinker`` on 127.0.0.1 over a tiny local model.

The server is a subprocess with its own Ray cluster (two logical GPUs; a LoRA pool's training
and sampling jobs share one, so two LoRA shapes fit side by side); tests talk to it with the
real ``tinker`` SDK.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import servers
from support.lasting import until_last_use
from support.servers import arctic_rl

from arctic_platform.rl.testing import free_port

TOKEN = "tml-arctic-test-key"


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run this package's cookbook test after its SDK tests, in the same slots.

    The recipe's process exits without finishing its Tinker session, so its model's pool keeps
    a logical GPU until the 120 s heartbeat timeout: run first, it held a GPU the other
    modules' pools need; run last, the server's stop frees it.
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


@pytest.fixture(scope="session")
def tinker_server(
    tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TinkerServer]:
    """One tinker server for the session's tinker tests (jobs start per model, on demand),
    stopped after the last of them (``support.lasting``)."""
    run_dir = tmp_path_factory.mktemp("tinker-run")
    token_file = run_dir / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    log = run_dir / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ARCTIC_RL_HOME": str(run_dir / "home")}
    env["RAY_metrics_report_interval_ms"] = "1000"  # the pool test reads the LoRA metrics
    command = arctic_rl(
        "serve", "--transport", "tinker", "--host", "127.0.0.1", "--port", str(port),
        "--token-file", str(token_file), "--run-dir", str(run_dir / "server"),
        "--num-gpus", "2", "--no-ray-auto-attach",
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    health = servers.answers(f"{base_url}/api/v1/healthz")
    what = "the tinker server's /api/v1/healthz"
    process = servers.spawn(command, log, health, what, timeout=300, env=env, new_session=False)
    release = until_last_use("tinker_server", lambda: servers.stop(process, reap_grace=30))
    try:
        yield TinkerServer(base_url, TOKEN, tiny_model_path, log, process)
    finally:
        release()


@pytest.fixture(scope="module")
def service(tinker_server: TinkerServer) -> Iterator[object]:
    """A ``tinker.ServiceClient`` on the server; closing it finishes the session, which
    destroys its models' pools' jobs and frees their GPUs for the next module's shapes."""
    import tinker

    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.token)
    yield client
    client.close("success").result(timeout=300)


@pytest.fixture(scope="module")
def training(service: object, tinker_server: TinkerServer) -> object:
    """One training client (a rank-8 LoRA adapter on the tiny model, or its full weights when
    the server runs with ARCTIC_RL_TINKER_FULL_FINE_TUNING=1) shared by a module's tests."""
    return service.create_lora_training_client(  # type: ignore[attr-defined]
        base_model=tinker_server.model, rank=8
    ).result(timeout=900)
