"""Faults on CPU with a real ``arctic-rl serve`` process, real Ray, DeepSpeed and vLLM workers.

One server (http transport, short ``--op-timeout``) holds two identical deterministic training
jobs (R, the uninterrupted reference, and K, the one whose client and server get killed) and
a sampling job S. The tests run in file order and share these jobs:

1. a retried ``fwd_bwd``/``step`` (same request id) is applied once;
2. K's client is SIGKILLed between ``fwd_bwd`` and ``step``; a new process finishes the run
   and K's losses equal R's;
3. a stopped (SIGSTOP) sampling worker makes ``generate`` time out naming job and operation
   while ``/health`` and ``/status`` answer;
4. a SIGKILLed sampling worker fails its job; ``restart_job`` brings it back;
5. the server is SIGKILLed after a checkpoint; ``serve --resume RUN_DIR`` brings the jobs back
   with the same ids and K continues from the saved step exactly as R did, and an agent
   session on S comes back with its turn, key and history (the next turn extends it);
6. a SIGKILLed training worker fails K; ``restart_job`` brings it back at its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fault_loop import DETERMINISTIC, LOSS
from fault_loop import batch as _batch
from processes import kill_loop_after_fwd_bwd
from support import servers
from support.clients import arctic_home, client_config
from support.servers import arctic_rl, descendants

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import ServerError
from arctic_platform.rl.plugins import get_registry
from arctic_platform.rl.run_dirs import read_or_create_token, server_run_dir
from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow

OP_TIMEOUT = 20.0  # short, for the hung-call test; long enough for every call here
LOOP = Path(__file__).with_name("fault_loop.py")  # the killed client's program
STEPS = 8  # the client-kill loop runs steps 1..STEPS-1 (step 0 is the retry test)
PROMPTS = ["12 + 30 =", "the sum of digits"]
GREEDY = {"n": 1, "max_tokens": 6, "temperature": 0.0}


def _session_generate(session: Any, prompt: list[int]) -> list[int]:
    """One token-in turn of an agent session (its key as the API key): the sampled ids."""
    import httpx

    url = session.base_url.removesuffix("/v1") + "/inference/v1/generate"
    body = {"model": session.model, "token_ids": prompt, "sampling_params": GREEDY}
    headers = {"Authorization": f"Bearer {session.api_key}"}
    answer = httpx.post(url, json=body, headers=headers, timeout=120, trust_env=False)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


@dataclass
class Server:
    """The ``arctic-rl serve`` process of this module and how to reach it."""

    run_dir: Path
    port: int
    token: str
    model: str
    proc: subprocess.Popen | None = None
    pids: set[int] = field(default_factory=set)  # processes under the server(s)

    def launch(self, *args: str) -> None:
        transport = self.transport()
        try:
            self.proc = servers.spawn(
                arctic_rl("serve", *args),
                self.run_dir / "test-server.log",
                transport.health,
                f"the http server on port {self.port} (transport.health())",
            )
        finally:
            transport.close()

    def remember_processes(self) -> None:
        assert self.proc is not None
        self.pids |= descendants(self.proc.pid)

    def transport(self):
        return get_registry().get("transport", "http").create("127.0.0.1", self.port, self.token)

    def config(self, **fields) -> ArcticRLClientConfig:
        values = dict(training_gpus=0, sampling_gpus=0, log_prob_gpus=0, **DETERMINISTIC)
        values.update(fields)
        return client_config(self.model, self.port, **values)


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    with arctic_home(tmp_path_factory.mktemp("arctic-home")):
        port = free_port()
        run_dir = server_run_dir("127.0.0.1", port, "http")
        run_dir.mkdir(parents=True)
        token = read_or_create_token(run_dir / "token")
        srv = Server(run_dir, port, token, tiny_model_path)
        srv.launch(
            "--host", "127.0.0.1", "--port", str(port), "--run-dir", str(run_dir),
            "--token-file", str(run_dir / "token"), "--num-gpus", "3",
            "--op-timeout", str(OP_TIMEOUT), "--no-ray-auto-attach",
        )  # fmt: skip
        yield srv
        if srv.proc is not None and srv.proc.poll() is None:
            srv.remember_processes()
            transport = srv.transport()
            try:
                transport.call("shutdown")
            except Exception:
                pass
            transport.close()
            try:
                srv.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                servers.stop(srv.proc)
        servers.reap(srv.pids)


@dataclass
class Jobs:
    reference: ArcticRLClient  # R: the uninterrupted run
    killed: ArcticRLClient  # K: its client and its server get killed
    sampler: ArcticRLClient  # S
    losses: dict[int, float] = field(default_factory=dict)  # R's loss per loop step
    saved: int = 0  # K's checkpointed step, and R's losses from there (test 5)
    expected: list[float] = field(default_factory=list)


@pytest.fixture(scope="module")
def jobs(server):
    """R, K and S created together (they start in parallel), each driven by its own client."""
    transport = server.transport()
    payload = server.config(training_gpus=1, sampling_gpus=1).initialize_payload()
    ids = {
        name: transport.call("initialize", {"job_type": job_type, "config": payload})["job_id"]
        for name, job_type in (("r", "training"), ("k", "training"), ("s", "sampling"))
    }
    transport.close()
    clients = {
        "r": ArcticRLClient(server.config(training_job_id=ids["r"]), progress=False),
        "k": ArcticRLClient(server.config(training_job_id=ids["k"]), progress=False),
        "s": ArcticRLClient(
            server.config(sampling_gpus=1, sampling_job_id=ids["s"]), progress=False
        ),
    }
    server.remember_processes()
    state = Jobs(clients["r"], clients["k"], clients["s"])
    yield state
    for client in [*clients.values(), state.killed, state.sampler]:
        client.close()


def test_fwd_bwd_and_step_retried_with_the_same_request_id_apply_once(jobs):
    r, k = jobs.reference, jobs.killed
    first = r.fwd_bwd(_batch(0), LOSS, request_id="fb-0")
    retried = r.fwd_bwd(_batch(0), LOSS, request_id="fb-0")
    assert retried["replayed"] is True and retried["loss"] == first["loss"]
    stepped = r.step(request_id="st-0")
    assert r.step(request_id="st-0") == {**stepped, "replayed": True}
    assert r.job_info("training")["global_step"] == 1
    jobs.losses[0] = first["loss"]

    # K, identical to R, gets each call once: a doubled gradient would double grad_norm
    once = k.fwd_bwd(_batch(0), LOSS, request_id="fb-0")
    assert "replayed" not in once and once["loss"] == first["loss"]
    assert k.step(request_id="st-0")["grad_norm"] == stepped["grad_norm"]
    assert r.weight_norm()["training"] == k.weight_norm()["training"]


def test_a_client_killed_mid_loop_is_replaced_and_the_losses_equal_an_uninterrupted_run(
    jobs, tmp_path
):
    r, k = jobs.reference, jobs.killed
    for i in range(1, STEPS):  # the uninterrupted run
        jobs.losses[i] = r.fwd_bwd(_batch(i), LOSS, request_id=f"fb-{i}")["loss"]
        r.step(request_id=f"st-{i}")

    config_file, log_file = tmp_path / "reconnect.json", tmp_path / "loop.jsonl"
    config_file.write_text(k.reconnect_config().model_dump_json())
    command = [sys.executable, str(LOOP), str(config_file), str(log_file), str(STEPS)]
    kill_loop_after_fwd_bwd(command, log_file, 3)  # before step(3)
    assert k.job_info("training")["global_step"] == 3  # the gradient of step 3 is pending

    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    losses = {rec["i"]: rec["loss"] for rec in records if rec["phase"] == "fwd_bwd"}
    replayed = [rec["i"] for rec in records if rec.get("replayed")]
    assert replayed == [3]  # the new process repeated fwd_bwd(3): answered, not applied again
    assert [losses[i] for i in range(1, STEPS)] == [jobs.losses[i] for i in range(1, STEPS)]
    assert k.job_info("training")["global_step"] == r.job_info("training")["global_step"] == STEPS
    assert k.weight_norm()["training"] == r.weight_norm()["training"]


def test_a_hung_engine_call_times_out_naming_job_and_operation_while_the_server_answers(
    jobs, server
):
    s = jobs.sampler
    assert s.generate(PROMPTS, GREEDY)["outputs"]
    info = s.job_info("sampling")
    pid = info["worker_pids"][0]
    outcome: dict = {}

    def call() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = s.generate(PROMPTS, GREEDY)
        except ServerError as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    os.kill(pid, signal.SIGSTOP)  # a real hang: the worker process stops mid-service
    try:
        caller = threading.Thread(target=call)
        caller.start()
        probe = server.transport()
        answers = 0
        while caller.is_alive():
            assert probe.health()
            assert probe.call("status")["jobs"]
            answers += 1
            time.sleep(1.0)
        probe.close()
    finally:
        os.kill(pid, signal.SIGCONT)
    error = outcome.get("error")
    assert isinstance(error, ServerError), outcome
    assert error.status_code == 504 and error.code == "timeout"
    assert "generate" in error.message and f"job {info['job_id']}" in error.message
    assert answers >= 5  # /health and /status answered all along
    assert s.generate(PROMPTS, GREEDY)["outputs"]  # the worker serves again once resumed


def _kill_worker_and_wait_failed(client: ArcticRLClient, job_type: str) -> None:
    """SIGKILL the first worker of ``client``'s ``job_type`` job; its job turns failed."""
    info = client.job_info(job_type)
    os.kill(info["worker_pids"][0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while info["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.5)
        info = client.job_info(job_type)
    assert info["state"] == "failed" and "died" in info["reason"]


def test_a_killed_sampling_worker_fails_its_job_and_restart_brings_it_back(jobs):
    s = jobs.sampler
    before = s.job_info("sampling")
    _kill_worker_and_wait_failed(s, "sampling")
    with pytest.raises(ServerError) as refused:
        s.generate(PROMPTS, GREEDY)
    assert refused.value.status_code == 409

    after = s.restart_job("sampling")
    assert after["job_id"] == before["job_id"] and after["state"] == "running"
    assert after["restarts"] == 1 and after["worker_pids"] != before["worker_pids"]
    assert s.generate(PROMPTS, GREEDY)["outputs"][0]["completions"]


def test_a_server_killed_after_a_checkpoint_resumes_the_jobs_and_training_continues(jobs, server):
    r, k, s = jobs.reference, jobs.killed, jobs.sampler
    sampler_id = s.job_ids["sampling"]
    synced = k.transport.call(  # S serves K's weights: after the crash it loads K's checkpoint
        "sync_weights", {"training_job_id": k.job_ids["training"], "sampling_job_ids": [sampler_id]}
    )
    k.save_checkpoint()
    saved = k.job_info("training")["global_step"]
    assert saved == STEPS
    # K goes one step and a gradient past the checkpoint: the crash loses them
    k.fwd_bwd(_batch(saved), LOSS, request_id=f"fb-{saved}")
    k.step(request_id=f"st-{saved}")
    k.fwd_bwd(_batch(saved + 1), LOSS, request_id=f"fb-{saved + 1}")
    # R continues from the same state, uninterrupted: the losses K must reproduce
    expected = []
    for i in (saved, saved + 1):
        expected.append(r.fwd_bwd(_batch(i), LOSS)["loss"])
        r.step()
    r.transport.call("destroy", {"job_id": r.job_ids["training"]})

    table_file = server.run_dir / "job_table.json"
    assert stat.S_IMODE(table_file.stat().st_mode) == 0o600
    assert server.token not in table_file.read_text()

    # an agent session on S with one token-in turn: it must outlive the crash
    session = s.open_session(ttl=600)
    first = _session_generate(session, [1, 20, 21, 22])
    turn1 = s.session_trajectory(session.session_id)["turns"]

    server.remember_processes()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    servers.reap(server.pids)  # Ray's processes go down with the server that started them
    server.launch("--resume", str(server.run_dir))  # address, transport, token from the table

    k2 = ArcticRLClient(k.reconnect_config(), progress=False)  # waits for the resumed job
    s2 = ArcticRLClient(s.reconnect_config(), progress=False)
    jobs.killed, jobs.sampler = k2, s2  # for the next test; the fixture closes them
    jobs.saved, jobs.expected = saved, expected
    states = {j["job_id"]: j for j in k2.get_server_state()["jobs"]}
    assert states[r.job_ids["training"]]["state"] == "terminated"  # stays destroyed
    assert k2.job_info("training")["global_step"] == saved
    sampler = s2.job_info("sampling")
    assert sampler["weights_from"].startswith("checkpoint ")  # K's checkpoint, not the base model
    assert sampler["weight_version"] == synced["weight_version"] + 1  # a new version, honestly
    assert s2.weight_norm()["sampling"] == pytest.approx(k2.weight_norm()["training"], rel=1e-5)
    # request ids outlive the server: one from before the checkpoint is answered, not applied
    assert k2.step(request_id=f"st-{saved - 1}")["replayed"] is True
    assert k2.job_info("training")["global_step"] == saved
    # a late retry of one the crash rolled back is refused, naming the checkpoint step
    with pytest.raises(ServerError, match=f"checkpoint at step {saved}") as refused:
        k2.fwd_bwd(_batch(saved + 1), LOSS, request_id=f"fb-{saved + 1}")
    assert refused.value.status_code == 409 and refused.value.code == "rolled_back"
    got = []
    for i in (saved, saved + 1):  # the same ids again, each back on its step: applied anew
        fb = k2.fwd_bwd(_batch(i), LOSS, request_id=f"fb-{i}")
        assert "replayed" not in fb
        got.append(fb["loss"])
        assert k2.step(request_id=f"st-{i}")["global_step"] == i + 1
    assert got == expected
    assert s2.generate(PROMPTS, GREEDY)["outputs"]
    # the session came back: same turn and key; the next turn extends it without a break
    assert session.session_id in {x["session_id"] for x in s2.list_sessions()}
    assert s2.session_trajectory(session.session_id)["turns"] == turn1
    second = _session_generate(session, [1, 20, 21, 22, *first, 23])
    turns = s2.session_trajectory(session.session_id)["turns"]
    assert [t["completion_ids"] for t in turns] == [first, second]
    assert turns[1]["prefix_break"] is False and turns[1]["segment"] == 0
    table = json.loads(table_file.read_text())
    assert table["next_job_id"] > max(j["job_id"] for j in table["jobs"])


def test_a_killed_training_worker_restarts_from_its_latest_checkpoint(jobs):
    k = jobs.killed  # the resumed K, two steps past its checkpoint
    before = k.job_info("training")
    assert before["global_step"] == jobs.saved + 2
    _kill_worker_and_wait_failed(k, "training")
    after = k.restart_job("training")
    assert after["state"] == "running" and after["global_step"] == jobs.saved
    assert k.fwd_bwd(_batch(jobs.saved), LOSS)["loss"] == jobs.expected[0]
    # the restarted trainer's new workers sync into S (no weight-sync state of the old ones)
    s = jobs.sampler
    sync = {"training_job_id": k.job_ids["training"], "sampling_job_ids": [s.job_ids["sampling"]]}
    assert k.transport.call("sync_weights", sync)["bytes"] > 0
    assert s.weight_norm()["sampling"] == pytest.approx(k.weight_norm()["training"], rel=1e-5)
