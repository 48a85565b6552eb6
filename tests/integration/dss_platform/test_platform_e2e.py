"""The dss-platform backend against a real ``arctic-rl platform serve`` on 127.0.0.1.

One platform server (a subprocess with its own Ray cluster, 4 logical GPUs) serves the
module. Alice runs the whole RL loop through ``ArcticRLClient(backend="dss-platform")``; Bob
runs a training job beside it. The last test kills the server mid-request and restarts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from support import servers
from support.clients import arctic_home, client_with_token, in_second_process
from support.rollouts import assert_log_prob_job_agrees, assert_scores_agree, rollouts
from support.servers import arctic_rl

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import JobError, ServerError
from arctic_platform.rl.server.job_table import load_table
from arctic_platform.rl.testing import free_port
from arctic_platform.rl.wire.frames import encode_frame
from arctic_rl_dss.chunks import encode_chunks
from arctic_rl_dss.transport import DssTransport, PollSettings

pytestmark = pytest.mark.slow

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-fedcba9876543210xyz"
CAROL = "carol-token-00112233445566778899"
PROMPTS = ["12 + 30 =", "the sum of digits", "write a number"]
FAST_POLL = {
    "ARCTIC_RL_DSS_POLL_INITIAL": "0.05",
    "ARCTIC_RL_DSS_POLL_FACTOR": "1.25",
    "ARCTIC_RL_DSS_POLL_MAX": "0.5",
    "ARCTIC_RL_DSS_POLL_TIMEOUT": "300",
}


class Platform:
    """A running platform server subprocess and how to reach it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.tokens = root / "tokens.json"
        self.tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB, "carol": CAROL}))
        self.run_dir = root / "platform"
        self.log = root / "platform.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = arctic_rl(
            "platform", "serve", "--host", "127.0.0.1", "--port", str(self.port),
            "--tokens", str(self.tokens), "--run-dir", str(self.run_dir), "--num-gpus", "4",
        )  # fmt: skip
        health = servers.answers(f"http://127.0.0.1:{self.port}/health")
        self.proc = servers.spawn(command, self.log, health, "the platform server's /health")

    def tree(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid, *servers.descendants(self.proc.pid)]

    def stop(self) -> None:
        if self.proc is not None:
            servers.stop(self.proc)

    def transport(self, token: str, **kwargs: object) -> DssTransport:
        poll = PollSettings(initial=0.05, factor=1.25, maximum=0.5, timeout=300)
        return DssTransport("127.0.0.1", self.port, token, poll=poll, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("platform")
    with arctic_home(root / "home", **FAST_POLL):
        server = Platform(root)
        server.start()
        yield server
        server.stop()


def _config(platform: Platform, model: str, **gpus: int) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name=model,
        backend="dss-platform",
        host="127.0.0.1",
        port=platform.port,
        training_gpus=gpus.get("training", 1),
        sampling_gpus=gpus.get("sampling", 1),
        log_prob_gpus=gpus.get("log_prob", 1),
        job_ready_timeout=600,
        training_config={"optimizer": {"lr": 1e-3}},
    )


@pytest.fixture(scope="module")
def alice(platform, tiny_model_path):
    client = client_with_token(_config(platform, tiny_model_path), ALICE)
    yield client
    client.close()


@pytest.fixture(scope="module")
def bob(platform, tiny_model_path):
    config = _config(platform, tiny_model_path, sampling=0, log_prob=0)
    client = client_with_token(config, BOB)
    yield client
    client.close()


def _fb_count(transport: DssTransport, number: int) -> int:
    return int(transport.call("get_job", {"job_id": number})["forward_backward_count"])


def _fb_records(transport: DssTransport) -> list[dict]:
    records = transport.raw("GET", f"/{transport.job_id}/requests").json()["requests"]
    return [r for r in records if r["operation"] == "forward-backward"]


# --- the loop ----------------------------------------------------------------------------


def test_no_token_is_a_clear_error_before_any_call(platform, tiny_model_path, monkeypatch):
    monkeypatch.delenv("ARCTIC_RL_PAT", raising=False)
    monkeypatch.delenv("ARCTIC_RL_PAT_FILE", raising=False)
    before = json.loads(httpx.get(f"http://127.0.0.1:{platform.port}/health").text)
    with pytest.raises(Exception, match="ARCTIC_RL_PAT"):
        ArcticRLClient(_config(platform, tiny_model_path), progress=False)
    assert before["status"] == "ok"


def test_one_platform_job_holds_three_running_sub_jobs_with_integer_ids(alice):
    ids = alice.job_ids
    assert all(isinstance(ids[t], int) for t in ("training", "sampling", "log_prob"))
    state = alice.get_server_state()
    assert len(state["jobs"]) == 1
    job = state["jobs"][0]
    assert job["status"] == "running"
    types = sorted(s["job_type"] for s in job["sub_jobs"])
    assert types == ["log_probability", "sampling", "training"]
    assert {s["sub_job_id"].split(":")[1] for s in job["sub_jobs"]} == {
        "training",
        "sampling",
        "log_prob",
    }
    assert state["capacity"]["in_use_gpus"] == 3


def test_the_whole_loop_runs_through_the_platform(alice):
    gen = alice.generate(PROMPTS, {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 3})
    assert len(gen["outputs"]) == len(PROMPTS)
    rows = rollouts(gen["outputs"])
    trainer = assert_log_prob_job_agrees(alice, rows)

    norm_before = alice.weight_norm()["training"]
    metrics = alice.fwd_bwd(
        rows.batch(old_log_probs=trainer, rollout_log_probs=rows.rollout_log_probs()),
        loss_config={"rollout_correction": "token_tis"},
    )
    assert "loss" in metrics
    assert 0.0 <= metrics["mismatch_k3"] < 1e-4  # sampler vs trainer, same fp32 weights
    # the correction's weights are all ~1 here: an effective sample size of ~1
    assert metrics["rollout_is_weight"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["rollout_is_ess"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["mismatch_ratio.min"] <= 1.0 <= metrics["mismatch_ratio.max"]
    assert alice.step()["global_step"] == 1
    assert alice.weight_norm()["training"] != norm_before

    synced = alice.sync_weights()
    assert synced["weight_version"] == 1 and synced["bytes"] > 0
    norms = alice.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-5)

    after = alice.generate(PROMPTS, {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 4})
    assert after["weight_version"] == 1
    assert_scores_agree(alice, after["outputs"], log_probs=False)


def test_cache_and_memory_operations_answer_inline(alice):
    alice.reset_prefix_cache()
    alice.empty_training_cache()
    for method in ("sleep_inference", "wake_inference", "sleep_log_prob", "wake_log_prob"):
        answer = getattr(alice, method)()
        assert answer["results"], (method, answer)
    t = alice.transport
    wrong = t.raw(
        "POST",
        f"/{t.job_id}/operation",
        json={"operation_type": "reset-prefix-cache", "sub_job_type": "training"},
    )
    assert wrong.status_code == 422


def test_restart_job_brings_a_sub_job_back_through_the_platform(alice):
    before = alice.job_info("sampling")["weight_version"]
    view = alice.restart_job("sampling")  # then synced from the running trainer
    assert view["state"] == "running" and view["job_id"] == alice.job_ids["sampling"]
    after = alice.generate(PROMPTS[:1], {"n": 1, "max_tokens": 4, "temperature": 0.0})
    assert after["outputs"][0]["completions"][0]["token_ids"]
    assert after["weight_version"] > before  # new workers, then the trainer's weights again
    norms = alice.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)


def test_metrics_through_the_platform_count_the_callers_own_requests(alice, platform):
    # carol holds no job here: bob's job would take the platform's last GPU, which
    # test_a_sub_job_that_cannot_start_reports_why needs
    a, b = alice.transport, platform.transport(CAROL)
    try:
        mine, theirs = a.call("metrics"), b.call("metrics")
        alice.fwd_bwd({"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]}, "importance_sampling")
        mine_after, theirs_after = a.call("metrics"), b.call("metrics")
    finally:
        b.close()
    fb = "forward-backward"
    assert mine_after["requests"][fb] == mine["requests"].get(fb, 0) + 1
    assert theirs_after["requests"].get(fb, 0) == theirs["requests"].get(fb, 0)
    assert mine_after["seconds"][fb] > 0
    assert mine_after["jobs_by_state"].get("running", 0) >= 3
    assert set(mine_after) == {"requests", "errors", "seconds", "jobs_by_state"}


def test_shutdown_through_the_platform_cancels_the_callers_jobs_only(
    alice, platform, tiny_model_path
):
    carol = platform.transport(CAROL)
    try:
        config = {"model_name": tiny_model_path, "training_gpus": 1, "sampling_gpus": 0}
        number = carol.call("initialize", {"job_type": "training", "config": config})["job_id"]
        answer = carol.call("shutdown")
        assert answer == {"status": "shutting down", "cancelled_jobs": [carol.job_id]}
        assert carol.call("get_job", {"job_id": number})["state"] == "cancelled"
        assert carol.call("health")["status"] == "ok"
        assert alice.job_info("training")["state"] == "running"
    finally:
        carol.close()


def test_checkpoints_are_listed_exported_loaded_and_deleted(alice):
    t = alice.transport
    path = alice.save_checkpoint(tag="ckpt-a")
    alice.fwd_bwd({"input_ids": [[1, 5, 6, 7, 8]], "advantages": [1.0]}, "importance_sampling")
    step = alice.step()["global_step"]
    job = t.job_id
    listed = t._send("GET", f"/{job}/checkpoints", what="list")["checkpoints"]
    assert [c["checkpoint_id"] for c in listed] == ["ckpt-a"]
    exported = t._send("POST", f"/{job}/checkpoints/ckpt-a:export", what="export")
    names = {f["filename"]: f for f in exported["files"]}
    weights = [n for n in names if n.endswith(".safetensors")]
    assert weights, sorted(names)
    got = t.raw("GET", names[weights[0]]["url"])
    assert got.status_code == 200 and len(got.content) == names[weights[0]]["size_bytes"]
    assert alice.load_checkpoint(path) == step - 1
    t.raw("DELETE", f"/{job}/checkpoints/ckpt-a").raise_for_status()
    assert t.raw("DELETE", f"/{job}/checkpoints/ckpt-a").status_code == 404
    assert not Path(path).exists()


def test_checkpoints_are_core_catalog_and_a_deleted_one_is_a_4xx_naming_saved_steps(
    alice, platform
):
    t = alice.transport
    job = t.job_id
    path = alice.save_checkpoint(tag="ckpt-b")
    table = load_table(platform.run_dir)  # core's job table: its catalog, path -> step
    assert table is not None
    core = next(j for j in table.jobs if j.job_id == alice.job_ids["training"]).checkpoints
    step = core[path]
    listed = t._send("GET", f"/{job}/checkpoints", what="list")["checkpoints"]
    assert {c["checkpoint_id"]: c["global_steps"] for c in listed} == {
        Path(p).name: s for p, s in core.items() if Path(p).is_dir()
    }
    assert next(c for c in listed if c["checkpoint_id"] == "ckpt-b")["global_steps"] == step
    t.raw("DELETE", f"/{job}/checkpoints/ckpt-b").raise_for_status()
    with pytest.raises(ServerError) as info:
        alice.load_checkpoint(step=step)
    assert 400 <= info.value.status_code < 500, info.value
    assert f"no checkpoint at step {step}; saved steps:" in info.value.message
    listed = t._send("GET", f"/{job}/checkpoints", what="list")["checkpoints"]
    assert "ckpt-b" not in {c["checkpoint_id"] for c in listed}


def test_after_a_load_a_retried_step_key_applies_again_and_a_fwd_bwd_key_is_a_409(alice):
    batch = {"input_ids": [[1, 5, 6, 7, 8]], "advantages": [1.0]}
    start = alice.step()["global_step"]  # where the job is (what was accumulated applied)
    alice.save_checkpoint(tag="before-retry")
    alice.fwd_bwd(batch, "importance_sampling", request_id="fb-rollback-1")
    first = alice.step(request_id="st-rollback-1")
    assert first["global_step"] == start + 1 and first["applied"] is True
    again = alice.step(request_id="st-rollback-1")  # core's ledger answers: not applied twice
    assert again["replayed"] is True and again["global_step"] == start + 1
    assert alice.load_checkpoint(step=start) == start  # rolls core's ledger back

    with pytest.raises(ServerError) as info:
        alice.fwd_bwd(batch, "importance_sampling", request_id="fb-rollback-1")
    assert info.value.status_code == 409 and info.value.code == "rolled_back", info.value
    assert "new chunk group id" in info.value.message
    alice.fwd_bwd(batch, "importance_sampling", request_id="fb-rollback-2")
    retried = alice.step(request_id="st-rollback-1")  # its step was undone: applied again
    assert retried["global_step"] == start + 1 and retried["applied"] is True
    assert "replayed" not in retried
    after = alice.step()  # the retry used the gradients: nothing is left to apply
    assert after["applied"] is False and after["global_step"] == start + 1


def test_a_second_process_reconnects_by_integer_ids(alice, platform, tmp_path):
    step_before = alice.step()["global_step"]
    body = """
        m = c.fwd_bwd({"input_ids": [[1, 5, 6, 7, 8]], "advantages": [1.0]},
                      loss_fn="importance_sampling")
        s = c.step()
        result = {"step": s["global_step"], "loss": m["loss"]}
        """
    env = {**os.environ, "ARCTIC_RL_PAT": ALICE}
    result = in_second_process(alice, body, tmp_path, env=env, timeout=300)
    assert result["step"] == step_before + 1
    # nothing accumulated here since: the step applies nothing, the jobs outlived the client
    assert alice.step()["global_step"] == step_before + 1
    assert len(alice.get_server_state()["jobs"]) == 1  # reconnecting created nothing


def test_bad_requests_get_clear_4xx_and_the_platform_keeps_serving(alice):
    t = alice.transport
    with pytest.raises(ServerError) as info:
        t.call("get_job", {"job_id": 99999})
    assert info.value.status_code == 404
    with pytest.raises(ServerError) as info:
        alice.fwd_bwd({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1]], "advantages": [1.0]})
    assert info.value.status_code == 422 and "loss_mask[0]" in info.value.message
    bad_step = t.raw("POST", f"/{t.job_id}/step", json={"learning_rate": -1})
    assert bad_step.status_code == 422 and "learning_rate" in bad_step.json()["message"]
    wrong = t.raw(
        "POST",
        f"/{t.job_id}/operation",
        json={"operation_type": "forward", "sub_job_type": "sampling", "payload": {}},
    )
    assert wrong.status_code == 422
    unknown = t.raw("POST", f"/{t.job_id}/operation", json={"operation_type": "explode"})
    assert unknown.status_code == 422 and "weight-sync" in unknown.json()["message"]
    assert alice.get_server_state()["jobs"][0]["status"] == "running"


def test_a_sub_job_that_cannot_start_reports_why(platform):
    config = _config(platform, "/nonexistent/model-dir", sampling=0, log_prob=0)
    with pytest.raises(JobError) as info:
        client_with_token(config.model_copy(update={"job_ready_timeout": 300}), CAROL)
    message = str(info.value)
    assert "failed" in message and "nonexistent" in message, message


# --- two users ---------------------------------------------------------------------------


def test_two_users_run_jobs_side_by_side_and_cannot_see_each_other(alice, bob, platform):
    a, b = alice.transport, bob.transport
    assert a.job_id != b.job_id
    assert [j["job_id"] for j in a.call("status")["jobs"]] == [a.job_id]
    assert [j["job_id"] for j in b.call("status")["jobs"]] == [b.job_id]

    results = {}

    def bob_trains():
        m = bob.fwd_bwd({"input_ids": [[1, 5, 6, 7]], "advantages": [1.0]}, "importance_sampling")
        results["bob"] = (m["loss"], bob.step()["global_step"])

    thread = threading.Thread(target=bob_trains)
    thread.start()
    metrics = alice.fwd_bwd(
        {"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]}, "importance_sampling"
    )
    thread.join(timeout=300)
    assert "loss" in metrics and results["bob"][1] == 1

    bob_job = b.job_id
    bob_number = bob.job_ids["training"]
    missing = a.raw("GET", "/no-such-job")
    assert missing.status_code == 404
    probes = [
        a.raw("GET", f"/{bob_job}"),
        a.raw("POST", f"/{bob_job}:cancel"),
        a.raw("GET", f"/{bob_job}/checkpoints"),
        a.raw("GET", f"/{bob_job}/requests"),
        a.raw("POST", f"/{bob_job}/step", json={}),
        a.raw("POST", f"/{bob_job}/operation", json={"operation_type": "weight-norm"}),
        a.raw("POST", f"/{bob_job}/forward-backward", content=b"x" * 10),
        a.raw("POST", f"/{bob_job}/generate", content=b"x" * 10),
        a.raw("POST", f"/{bob_job}/save", json={}),
        a.raw("POST", f"/{bob_job}/load", json={}),
        a.raw("POST", f"/{bob_job}/checkpoints/global_step1:export"),
        a.raw("DELETE", f"/{bob_job}/checkpoints/global_step1"),
    ]
    for answer in probes:
        assert answer.status_code == 404, (answer.request.url, answer.text)
        assert answer.json()["code"] == missing.json()["code"]
        assert "bob" not in answer.text
    assert a.raw("GET", "/", params={"sub_job": bob_number}).json() == {"jobs": []}
    with pytest.raises(ServerError) as info:
        a.call("get_job", {"job_id": bob_number})
    assert info.value.status_code == 404 and "bob" not in info.value.message
    record = b.raw("GET", f"/{bob_job}/requests").json()["requests"][0]
    assert a.raw("GET", f"/{bob_job}/requests/{record['request_id']}").status_code == 404
    assert a.raw("GET", f"/{a.job_id}/requests/{record['request_id']}").status_code == 404

    url = f"http://127.0.0.1:{platform.port}/{a.job_id}"
    assert httpx.get(url).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer not-a-real-token-at-all"})
    assert wrong.status_code == 401 and "alice" not in wrong.text and "bob" not in wrong.text
    assert (
        httpx.get(f"http://127.0.0.1:{platform.port}/", headers={"Authorization": "x"}).status_code
        == 401
    )
    assert b.call("get_job", {"job_id": bob_number})["state"] == "running"


def test_a_create_whose_answer_was_lost_makes_exactly_one_job(bob, tiny_model_path):
    b = bob.transport
    sub = {
        "job_type": "training",
        "model_name": tiny_model_path,
        "training_config": {"n_gpus": 1},
        "arctic_rl_config": {"job_ready_timeout": 120},
    }
    body = {"sub_job_configs": [sub], "job_id": "lost-answer-1"}
    first = b.raw("POST", "/", json=body)  # created; the client is about to lose this answer
    assert first.status_code == 201 and first.json()["status"] in ("pending", "placing")
    again = b.raw("POST", "/", json=body)
    assert again.status_code == 409 and again.json()["code"] == "job_exists"
    assert b._after_lost_create("lost-answer-1", body)["job_id"] == "lost-answer-1"
    ids = [j["job_id"] for j in b.call("status")["jobs"]]
    assert ids.count("lost-answer-1") == 1 and len(ids) == 2
    assert b.call("status")["capacity"]["available_gpus"] == 0  # the 4 GPUs are in use
    cancelled = b.raw("POST", "/lost-answer-1:cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert b.raw("POST", "/lost-answer-1:cancel").status_code == 200  # idempotent
    by_status = {
        status: [j["job_id"] for j in b.raw("GET", "/", params={"status": status}).json()["jobs"]]
        for status in ("running", "cancelled", "failed")
    }
    assert by_status == {"running": [b.job_id], "cancelled": ["lost-answer-1"], "failed": []}


class AnswerDroppingProxy:
    """A TCP relay on 127.0.0.1 that forwards requests but drops the first answer, like a
    network that fails after the platform has acted."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.drop = 1
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        drop, self.drop = self.drop > 0, self.drop - 1

        def forward() -> None:
            try:
                while data := client.recv(65536):
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            first = upstream.recv(65536)  # the platform has answered: it acted
            if drop:
                return
            client.sendall(first)
            while data := upstream.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):  # shutdown wakes the other thread's recv
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_create_whose_answer_is_lost_on_the_network_makes_one_job(platform):
    proxy = AnswerDroppingProxy(platform.port)
    poll = PollSettings(initial=0.05, factor=1.25, maximum=0.5, timeout=60)
    carol = DssTransport("127.0.0.1", proxy.port, CAROL, poll=poll, timeout=30)
    direct = platform.transport(CAROL)
    try:
        before = {j["job_id"] for j in direct.call("status")["jobs"]}
        carol.create_job({"model_name": "unused", "training_gpus": 1, "job_ready_timeout": 60})
        assert proxy.drop < 0  # the create's answer was really dropped
        after = {j["job_id"] for j in direct.call("status")["jobs"]}
        assert after - before == {carol.job_id}  # exactly one new job, the one the client holds
        direct.raw("POST", f"/{carol.job_id}:cancel").raise_for_status()
    finally:
        carol.close()
        direct.close()
        proxy.close()


def test_a_job_that_cannot_be_placed_in_time_hits_job_ready_timeout(bob, platform):
    assert bob.transport.call("status")["capacity"]["available_gpus"] == 0
    config = _config(platform, "unused-model", sampling=0, log_prob=0)
    with pytest.raises(JobError, match="job_ready_timeout"):
        client_with_token(config.model_copy(update={"job_ready_timeout": 2}), CAROL)
    carol = platform.transport(CAROL)
    try:
        states = [j["status"] for j in carol.call("status")["jobs"]]
    finally:
        carol.close()
    assert states[-1] in ("cancelled", "failed")  # nothing left holding or waiting for GPUs


def test_the_served_openapi_document_is_the_checked_in_one(platform):
    served = httpx.get(f"http://127.0.0.1:{platform.port}/openapi.json").json()
    doc = Path(__file__).resolve().parents[3] / "docs" / "platform-openapi.json"
    assert served == json.loads(doc.read_text())


# --- chunked frames and idempotency -------------------------------------------------------


def test_a_150_mib_forward_backward_frame_goes_through_in_chunks_once(alice):
    t = alice.transport
    training = alice.job_ids["training"]
    rows, width = 4, 150 * 1024 * 1024 // (4 * 8)
    ids = np.zeros((rows, width), dtype=np.int64)
    mask = np.zeros((rows, width), dtype=np.uint8)
    real = np.array(
        [[1, 5, 6, 7, 8, 9], [1, 7, 7, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 9, 8, 7, 6, 5]]
    )
    ids[:, :6], mask[:, :6] = real, 1
    sub_job_id = t.sub_jobs[training].sub_job_id
    frame = encode_frame(
        {
            "batch": {"input_ids": ids, "attention_mask": mask, "advantages": np.ones(rows)},
            "loss_fn": "importance_sampling",
            "sub_job_id": sub_job_id,
        }
    )
    del ids, mask
    assert len(frame) > 150 * 1024 * 1024
    chunks = encode_chunks(frame, "forward-backward", "big-group-1")
    del frame
    assert len(chunks) == 3
    before = _fb_count(t, training)
    records = len(_fb_records(t))
    path = f"/{t.job_id}/forward-backward"
    acks = [t._send("POST", path, what="chunk", content=c) for c in chunks]
    assert [a.get("received_chunks") for a in acks[:2]] == [1, 2]
    request_id = acks[-1]["request_id"]
    result = t.wait_request(t.job_id, request_id, "forward-backward")
    assert result["tokens"] == pytest.approx(rows * 5)  # padding trimmed: 5 scored tokens a row
    assert _fb_count(t, training) == before + 1

    replay = t._send("POST", path, what="replay", content=chunks[-1])
    assert replay["request_id"] == request_id and replay["replayed"] is True
    first = t._send("POST", path, what="replay chunk 0", content=chunks[0])
    assert first["request_id"] == request_id
    reuse = t.raw(
        "POST", path, content=encode_chunks(b"other", "forward-backward", "big-group-1")[0]
    )
    assert reuse.status_code == 409 and reuse.json()["code"] == "chunk_group_conflict"
    assert t.wait_request(t.job_id, replay["request_id"], "fb")["loss"] == result["loss"]
    assert _fb_count(t, training) == before + 1
    assert len(_fb_records(t)) == records + 1


def test_a_corrupted_chunk_is_rejected_and_nothing_is_applied(alice):
    t = alice.transport
    training = alice.job_ids["training"]
    sub_job_id = t.sub_jobs[training].sub_job_id
    frame = encode_frame(
        {
            "batch": {"input_ids": [[1, 5, 6, 7, 8]] * 40, "advantages": [1.0] * 40},
            "loss_fn": "importance_sampling",
            "sub_job_id": sub_job_id,
        }
    )
    chunks = encode_chunks(frame, "forward-backward", "small-group", chunk_bytes=512)
    assert len(chunks) >= 3
    path = f"/{t.job_id}/forward-backward"
    before = _fb_count(t, training)
    late = t.raw("POST", path, content=encode_chunks(frame, "forward-backward", "other", 512)[1])
    assert late.status_code == 409 and late.json()["code"] == "chunk_group_restart_required"

    t._send("POST", path, what="chunk 0", content=chunks[0])
    corrupt = bytearray(chunks[1])
    corrupt[-3] ^= 0xFF  # a byte of the slice itself
    answer = t.raw("POST", path, content=bytes(corrupt))
    assert answer.status_code == 422 and "corrupt" in answer.json()["message"]
    garbage = t.raw("POST", path, content=b"\x00" * 64)
    assert 400 <= garbage.status_code < 500
    assert _fb_count(t, training) == before
    assert not [
        r for r in t.raw("GET", f"/{t.job_id}/requests").json()["requests"]
        if r["operation"] == "forward-backward" and r["status"] != "done"
    ]  # fmt: skip

    last = None
    for chunk in chunks[1:]:  # the good chunks complete the group: applied exactly once
        last = t._send("POST", path, what="chunk", content=chunk)
    assert last is not None and "request_id" in last
    t.wait_request(t.job_id, last["request_id"], "fb")
    assert _fb_count(t, training) == before + 1


def test_a_chunked_generate_frame_is_reassembled(alice, platform):
    small = platform.transport(ALICE, chunk_bytes=256)
    try:
        answer = small.call(
            "generate",
            {
                "job_id": alice.job_ids["sampling"],
                "prompts": PROMPTS,
                "sampling_params": {"max_tokens": 4, "temperature": 0.0},
            },
        )
    finally:
        small.close()
    assert len(answer["outputs"]) == len(PROMPTS)
    assert [r["operation"] for r in _records(alice.transport)].count("generate") >= 1


def test_a_poll_with_wait_s_answers_when_the_request_ends(alice):
    t = alice.transport
    sampling = t.sub_jobs[alice.job_ids["sampling"]].sub_job_id
    frame = encode_frame(
        {
            "prompts": PROMPTS * 20,
            "sampling_params": {"n": 2, "max_tokens": 100, "min_tokens": 100},
            "sub_job_id": sampling,
        }
    )
    submitted = t.raw("POST", f"/{t.job_id}/generate", content=frame).json()
    url = f"/{t.job_id}/requests/{submitted['request_id']}"
    assert t.raw("GET", url).json()["status"] in ("pending", "running")
    held = t.raw("GET", url, params={"wait_s": 30})
    assert held.json()["status"] == "done", held.text[:300]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _records(transport: DssTransport) -> list[dict]:
    return transport.raw("GET", f"/{transport.job_id}/requests").json()["requests"]


# --- kill and restart (last: it replaces the module's server) -----------------------------


def test_killing_the_platform_mid_request_gives_a_clear_error_and_creates_nothing_twice(
    alice, bob, platform
):
    t = alice.transport
    jobs_before = sorted(j["job_id"] for j in t.call("status")["jobs"])
    outcome: dict[str, object] = {}

    def long_generate():
        try:
            outcome["result"] = alice.generate(
                PROMPTS * 20, {"n": 2, "max_tokens": 300, "min_tokens": 300, "temperature": 1.0}
            )
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=long_generate)
    thread.start()
    deadline = time.monotonic() + 60
    running = None
    while time.monotonic() < deadline and running is None:
        records = t.raw("GET", f"/{t.job_id}/requests").json()["requests"]
        running = next(
            (r for r in records if r["operation"] == "generate" and r["status"] == "running"), None
        )
        time.sleep(0.05)
    assert running is not None, "the generate request never ran"
    # Freeze everything under the platform server (its jobs' servers and engines): nothing can
    # finish the generate now, so the kill lands while it runs, however slow the machine.
    tree = platform.tree()
    for pid in tree[1:]:
        os.kill(pid, signal.SIGSTOP)
    still = next(r for r in _records(t) if r["request_id"] == running["request_id"])
    assert still["status"] == "running", still
    servers.kill(tree)
    platform.proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while alive := [pid for pid in tree if _alive(pid)]:  # the port and GPUs are free again
        assert time.monotonic() < deadline, f"processes survived SIGKILL: {alive}"
        time.sleep(0.05)
    platform.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    listed = _records(t)
    status = next(r for r in listed if r["request_id"] == running["request_id"])["status"]
    assert status == "failed", (status, outcome)  # a clear error, not a loss
    error = outcome["error"]
    assert isinstance(error, ServerError) and error.code == "server_restarted", error
    assert "in flight" in error.message

    after = t.call("status")["jobs"]
    assert sorted(j["job_id"] for j in after) == jobs_before
    assert after[0]["status"] == "failed" and "restarted" in after[0]["reason"]
    with pytest.raises(ServerError) as info:
        alice.step()
    assert info.value.status_code == 409
    assert len(bob.transport.call("status")["jobs"]) == 2  # his job and the cancelled one
