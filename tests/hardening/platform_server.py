"""One real ``arctic-rl platform serve`` for the platform hardening tests (fuzzing, security).

Two users: alice runs one platform job (a training and a sampling sub-job on the tiny model,
the cheapest job that exercises the data plane) with a checkpoint and finished requests;
bob has a token and nothing else. The fixture is package-scoped (exported by conftest.py)
so the fuzzing and security modules pay for the server and the job once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import servers
from support.clients import arctic_home, client_config, client_with_token
from support.lasting import until_last_use

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.testing import free_port

ALICE = "alice-hardening-token-0123456789"
BOB = "bob-hardening-token-9876543210xy"
CLUSTER_GPUS = 2
FAST_POLL = {
    "ARCTIC_RL_DSS_POLL_INITIAL": "0.05",
    "ARCTIC_RL_DSS_POLL_FACTOR": "1.25",
    "ARCTIC_RL_DSS_POLL_MAX": "0.5",
    "ARCTIC_RL_DSS_POLL_TIMEOUT": "300",
}


@dataclass
class LivePlatform:
    """The running platform server, alice's client and the ids a fuzzer aims at."""

    base_url: str
    run_dir: Path
    tokens_file: Path
    pid: int
    alice: ArcticRLClient
    job_id: str = ""
    sub_job_ids: list[str] = field(default_factory=list)
    sub_job_numbers: list[int] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    checkpoint_ids: list[str] = field(default_factory=list)
    checkpoint_paths: list[str] = field(default_factory=list)

    def http(self, token: str = ALICE, timeout: float = 120.0) -> httpx.Client:
        """A plain httpx client carrying ``token``."""
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def job(self) -> dict[str, Any]:
        """Alice's job as the server describes it."""
        with self.http() as http:
            answer = http.get(f"/{self.job_id}")
        answer.raise_for_status()
        return dict(answer.json())

    def assert_healthy(self) -> None:
        """The server answers and alice's job and its sub-jobs are still running."""
        with self.http(timeout=30) as http:
            assert http.get("/health").status_code == 200
        job = self.job()
        assert job["status"] == "running", job
        assert all(s["status"] == "running" for s in job["sub_jobs"]), job


def _prepare(live: LivePlatform) -> None:
    """A generate, a forward-backward, a step and a checkpoint: ids the fuzzer can aim at."""
    alice = live.alice
    out = alice.generate(["1 + 2 ="], {"n": 1, "max_tokens": 4, "temperature": 0.0})
    assert out["outputs"][0]["completions"][0]["token_ids"]
    alice.fwd_bwd({"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]})
    alice.step()
    live.checkpoint_paths.append(alice.save_checkpoint(tag="fuzz-ckpt"))
    live.job_id = str(alice.transport.job_id)  # type: ignore[attr-defined]
    job = live.job()
    live.sub_job_ids = [s["sub_job_id"] for s in job["sub_jobs"]]
    live.sub_job_numbers = [int(s["number"]) for s in job["sub_jobs"]]
    with live.http() as http:
        records = http.get(f"/{live.job_id}/requests").json()["requests"]
        listed = http.get(f"/{live.job_id}/checkpoints").json()["checkpoints"]
    live.request_ids = [r["request_id"] for r in records]
    live.checkpoint_ids = [c["checkpoint_id"] for c in listed]
    assert live.request_ids and live.checkpoint_ids == ["fuzz-ckpt"]


@pytest.fixture(scope="package")
def platform_live(
    tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LivePlatform]:
    """The platform server with alice's running job; stopped (job, server, Ray) after the last
    test that uses it (``support.lasting``: a package fixture here lives as long as the session)."""
    root = tmp_path_factory.mktemp("platform-hardening")
    tokens = root / "tokens.json"
    users = [
        {"name": "alice", "token": ALICE, "reserved_gpus": CLUSTER_GPUS},
        {"name": "bob", "token": BOB},
    ]
    tokens.write_text(json.dumps({"users": users}))
    tokens.chmod(0o600)
    port = free_port()
    run_dir = root / "platform"
    command = servers.arctic_rl(
        "platform", "serve", "--host", "127.0.0.1", "--port", str(port), "--tokens", str(tokens),
        "--run-dir", str(run_dir), "--num-gpus", str(CLUSTER_GPUS),
    )  # fmt: skip
    with ExitStack() as stack:  # closed after the last platform test, or at the end
        release = until_last_use("platform_live", stack.close)
        stack.enter_context(arctic_home(root / "home", **FAST_POLL))
        health = servers.answers(f"http://127.0.0.1:{port}/health")
        what = "the hardening platform server's /health"
        proc = servers.spawn(command, root / "platform.log", health, what)
        stack.callback(servers.stop, proc)
        # The kit's client config on the platform backend, Ray attach and server logs as by default.
        config = client_config(
            tiny_model_path,
            port,
            backend="dss-platform",
            log_prob_gpus=0,
            ray_auto_attach=True,
            server_logs=True,
        )
        client = client_with_token(config, ALICE)
        stack.callback(client.close)
        live = LivePlatform(f"http://127.0.0.1:{port}", run_dir, tokens, proc.pid, client)
        _prepare(live)
        yield live
        release()
