"""One real server for every hardening test: ``arctic-rl serve`` (http) with three running jobs.

The local backend launches the server subprocess with its Ray cluster; training (DeepSpeed),
sampling (vLLM) and log-prob (vLLM) jobs run on the tiny model, one logical GPU each. The
fixture is package-scoped so fuzzing, bad data, load and security tests pay for it once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from platform_server import platform_live  # noqa: F401  (package-scoped, shared)

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.testing import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # the load test drives bench/load.py
    sys.path.insert(0, str(REPO_ROOT))


@dataclass
class LiveServer:
    """A running server, the client that started it, and what a raw HTTP caller needs."""

    client: ArcticRLClient
    base_url: str
    token: str
    run_dir: Path
    home: Path
    pid: int

    @property
    def auth(self) -> dict[str, str]:
        """The header that authorises a request."""
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def job_ids(self) -> dict[str, int]:
        """Job id per job type (all three exist)."""
        return {k: int(v) for k, v in self.client.job_ids.items() if v is not None}

    def http(self, timeout: float = 120.0) -> httpx.Client:
        """A plain httpx client carrying the token."""
        return httpx.Client(base_url=self.base_url, headers=self.auth, timeout=timeout)

    def states(self) -> dict[int, str]:
        """State of every job the server knows, by id."""
        return {j["job_id"]: j["state"] for j in self.client.get_server_state()["jobs"]}

    def assert_healthy(self) -> None:
        """The server answers and each of the three jobs is still running."""
        with self.http(timeout=30) as http:
            assert http.get("/health").status_code == 200
        states = self.states()
        for job_type, job_id in self.job_ids.items():
            assert states[job_id] == "running", (job_type, states)


@pytest.fixture(scope="package")
def live(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The shared server with its three jobs; shut down (jobs, server, Ray) at the end."""
    home = tmp_path_factory.mktemp("hardening-home")
    old = os.environ.get("ARCTIC_RL_HOME")
    os.environ["ARCTIC_RL_HOME"] = str(home)
    port = free_port()
    config = ArcticRLClientConfig(
        model_name=tiny_model_path,
        comm_protocol="http",
        host="127.0.0.1",
        port=port,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
        ray_auto_attach=False,
        server_logs=False,
        startup_timeout=300,
        job_ready_timeout=600,
        training_config={"optimizer": {"lr": 1e-3}},
    )
    client = ArcticRLClient(config, progress=False)
    backend = client.backend
    run_dir = Path(backend.run_dir)  # type: ignore[attr-defined]
    server = LiveServer(
        client=client,
        base_url=f"http://127.0.0.1:{port}",
        token=(run_dir / "token").read_text().strip(),
        run_dir=run_dir,
        home=home,
        pid=int(backend._server_pid()),  # type: ignore[attr-defined]
    )
    try:
        yield server
    finally:
        try:
            client.shutdown()
        finally:
            if old is None:
                os.environ.pop("ARCTIC_RL_HOME", None)
            else:
                os.environ["ARCTIC_RL_HOME"] = old
