"""One real ``arctic-rl platform serve`` for the platform hardening tests (fuzzing, security).

Two users: alice runs one platform job (a training and a sampling sub-job on the tiny model,
the cheapest job that exercises the data plane) with a checkpoint and finished requests;
bob has a token and nothing else. The fixture is package-scoped (exported by conftest.py)
so the fuzzing and security modules pay for the server and the job once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
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


def _start(cmd: list[str], log: Path, port: int) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).is_success:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("platform server did not come up:\n" + log.read_text()[-3000:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    pids = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(2)
    for pid in pids:
        if psutil.pid_exists(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)


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
    """The platform server with alice's running job; stopped (job, server, Ray) at the end."""
    keys = [*FAST_POLL, "ARCTIC_RL_HOME", "ARCTIC_RL_PAT"]
    old = {k: os.environ.get(k) for k in keys}
    root = tmp_path_factory.mktemp("platform-hardening")
    os.environ.update(FAST_POLL)
    os.environ["ARCTIC_RL_HOME"] = str(root / "home")
    tokens = root / "tokens.json"
    users = [
        {"name": "alice", "token": ALICE, "reserved_gpus": CLUSTER_GPUS},
        {"name": "bob", "token": BOB},
    ]
    tokens.write_text(json.dumps({"users": users}))
    tokens.chmod(0o600)
    port = free_port()
    run_dir = root / "platform"
    cmd = [sys.executable, "-m", "arctic_platform.rl.cli", "platform", "serve"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--tokens", str(tokens)]
    cmd += ["--run-dir", str(run_dir), "--num-gpus", str(CLUSTER_GPUS)]
    proc = _start(cmd, root / "platform.log", port)
    client: ArcticRLClient | None = None
    try:
        config = ArcticRLClientConfig(
            model_name=tiny_model_path,
            backend="dss-platform",
            host="127.0.0.1",
            port=port,
            training_gpus=1,
            sampling_gpus=1,
            log_prob_gpus=0,
            job_ready_timeout=600,
            training_config={"optimizer": {"lr": 1e-3}},
        )
        os.environ["ARCTIC_RL_PAT"] = ALICE
        try:
            client = ArcticRLClient(config, progress=False)
        finally:
            os.environ.pop("ARCTIC_RL_PAT", None)
        live = LivePlatform(f"http://127.0.0.1:{port}", run_dir, tokens, proc.pid, client)
        _prepare(live)
        yield live
    finally:
        try:
            if client is not None:
                client.close()
        finally:
            _stop(proc)
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
