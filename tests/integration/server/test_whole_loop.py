"""The whole RL loop on CPU through the local backend, the http transport and real engines.

Training (DeepSpeed), sampling (vLLM) and log-prob (vLLM) jobs each get one logical GPU (the
colocated and ray variants are rows of tests/e2e/test_matrix.py). The server runs as a real
``arctic-rl serve`` subprocess with a real Ray cluster; a second process reconnects to the
same jobs.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from support.clients import in_second_process
from support.rollouts import assert_log_prob_job_agrees, assert_scores_agree, rollouts

from arctic_platform.rl.errors import JobError, ServerError

# after the other tests of the shared server (hardening's): it ends with the server's shutdown
pytestmark = [pytest.mark.slow, pytest.mark.live_last]

PROMPTS = ["12 + 30 =", "the sum of digits", "write a number"]
GREEDY = {"n": 1, "max_tokens": 8, "temperature": 0.0}


# The colocated and ray-transport variants of this loop (and every other knob) run as rows
# of the configuration matrix (tests/e2e/test_matrix.py); this module runs on the session's
# shared server (``live``: the hardening tests' too) what the matrix does not do: bad
# requests, a killed worker, shutdown (last), dense batches.
@pytest.fixture(scope="module")
def loop(live):
    """A client with all three jobs running, and the server's pid; nothing pending, every job
    on the trainer's weights."""
    live.settle()
    return live.client, live.pid


def test_every_job_is_running(loop):
    client, _ = loop
    state = client.get_server_state()
    jobs = {j["job_id"]: j for j in state["jobs"]}
    for job_type, job_id in client.job_ids.items():
        assert jobs[job_id]["state"] == "running" and jobs[job_id]["job_type"] == job_type
    assert state["cluster"]["cpu_mode"] is True


def test_generate_log_probs_fwd_bwd_step_and_sync(loop):
    client, _ = loop
    gen = client.generate(PROMPTS, {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 3})
    assert len(gen["outputs"]) == len(PROMPTS)
    assert all(len(o["completions"]) == 2 for o in gen["outputs"])
    version = gen["weight_version"]  # the shared jobs' version when this module starts
    step = client.job_info("training")["global_step"]
    rows = rollouts(gen["outputs"])

    trainer = assert_log_prob_job_agrees(client, rows)

    norm_before = client.weight_norm()["training"]
    metrics = client.fwd_bwd(rows.batch(old_log_probs=trainer), loss_fn="grpo")
    assert "loss" in metrics
    stepped = client.step()
    assert stepped["global_step"] == step + 1
    assert client.weight_norm()["training"] != norm_before

    synced = client.sync_weights()
    assert synced["weight_version"] == version + 1 and synced["bytes"] > 0
    norms = client.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-5)

    after = client.generate(PROMPTS, {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 4})
    assert after["weight_version"] == version + 1
    assert_scores_agree(client, after["outputs"])


def test_metrics_split_each_operation_into_its_wait_for_workers_and_the_rest(loop):
    client, _ = loop
    before = client.transport.call("metrics")
    gen = client.generate(PROMPTS, {"n": 1, "max_tokens": 4, "temperature": 0.0})
    client.fwd_no_grad({"input_ids": rollouts(gen["outputs"]).input_ids})
    after = client.transport.call("metrics")
    for op in ("generate", "fwd_no_grad"):
        total = after["seconds"][op] - before["seconds"].get(op, 0.0)
        waited = after["worker_seconds"][op] - before["worker_seconds"].get(op, 0.0)
        assert 0.0 < waited <= total, (op, waited, total)


def test_a_left_padded_tensor_batch_scores_like_its_rows(loop):
    import torch

    client, _ = loop
    rows = {"input_ids": [[1, 5, 6, 7, 8], [1, 9, 10]], "advantages": [1.0, -1.0]}
    dense = {
        "input_ids": torch.tensor([[1, 5, 6, 7, 8], [0, 0, 1, 9, 10]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]),
        "advantages": torch.tensor([1.0, -1.0]),
    }
    want = client.fwd_bwd(rows, "grpo", forward_only=True, return_log_probs=True)
    got = client.fwd_bwd(dense, "grpo", forward_only=True, return_log_probs=True)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-9)
    assert got["tokens"] == want["tokens"] == 6  # all but each row's first token
    for mine, theirs in zip(got["log_probs"], want["log_probs"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-6)
    no_grad = client.fwd_no_grad({k: v for k, v in dense.items() if k != "advantages"})
    for mine, theirs in zip(no_grad, want["log_probs"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)


def test_a_second_process_reconnects_and_continues_training(loop, live, tmp_path):
    client, _ = loop
    path = client.save_checkpoint()
    assert os.path.isdir(path)
    idle = client.step()  # nothing accumulated since the last step: nothing changes
    assert idle["applied"] is False
    step_before = idle["global_step"]
    body = """
        idle = c.step()  # a reconnected process steps before any fwd_bwd (issue 17)
        m = c.fwd_bwd({"input_ids": [[1, 5, 6, 7, 8]], "advantages": [1.0]},
                      loss_fn="importance_sampling")
        s = c.step()
        result = {"idle": [idle["applied"], idle["global_step"]],
                  "step": s["global_step"], "applied": s["applied"], "loss": m["loss"]}
        """
    result = in_second_process(client, body, tmp_path, env=live.env())
    assert result["idle"] == [False, step_before]
    assert result["step"] == step_before + 1 and result["applied"] is True
    assert client.step()["global_step"] == step_before + 1  # the jobs outlived the other client


def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(loop):
    client, _ = loop
    t = client.transport
    with pytest.raises(ServerError) as info:
        t.call("get_job", {"job_id": 9999})
    assert info.value.status_code == 404
    with pytest.raises(ServerError) as info:
        t.call("generate", {"job_id": client.job_ids["sampling"]})
    assert info.value.status_code == 422 and "prompts" in info.value.message
    with pytest.raises(ServerError) as info:
        t.call("step", {"job_id": client.job_ids["sampling"]})
    assert info.value.status_code == 409
    with pytest.raises(ServerError) as info:
        client.fwd_bwd({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1]], "advantages": [1.0]})
    assert info.value.status_code == 422 and "loss_mask[0]" in info.value.message
    cfg = client.config
    if cfg.comm_protocol == "http":
        from arctic_platform.rl.plugins import get_registry

        bad = get_registry().get("transport", "http").create(cfg.host, cfg.port, "wrong-token")
        with pytest.raises(ServerError) as info:
            bad.call("status")
        assert info.value.status_code == 401
        bad.close()
    assert client.get_server_state()["jobs"]


def test_killed_sampling_worker_fails_its_job_and_the_others_keep_working(loop):
    client, _ = loop
    sampling = client.job_ids["sampling"]
    job = client.transport.call("get_job", {"job_id": sampling})
    os.kill(job["worker_pids"][0], signal.SIGKILL)
    try:
        deadline = time.monotonic() + 60
        state = job
        while time.monotonic() < deadline:
            state = client.transport.call("get_job", {"job_id": sampling})
            if state["state"] == "failed":
                break
            time.sleep(0.5)
        assert state["state"] == "failed" and "died" in state["reason"]
        started = time.monotonic()
        with pytest.raises(ServerError) as info:
            client.generate(PROMPTS, GREEDY)
        assert info.value.status_code == 409 and "failed" in info.value.message
        assert time.monotonic() - started < 5
        assert client.step()["global_step"] >= 1
        assert client.log_probs([[1, 2]], [[3, 4]])["outputs"]
    finally:  # the shared server keeps its three running jobs
        assert client.restart_job("sampling")["state"] == "running"


def test_shutdown_leaves_no_process_behind(loop):
    client, pid = loop
    children = [p.pid for p in psutil.Process(pid).children(recursive=True)]
    client.shutdown()
    deadline = time.monotonic() + 60
    alive = [pid, *children]
    while time.monotonic() < deadline:
        alive = [
            p
            for p in [pid, *children]
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, f"left behind: {[psutil.Process(p).cmdline() for p in alive]}"
    with pytest.raises(JobError):
        client.generate(PROMPTS, GREEDY)
