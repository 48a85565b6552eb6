"""The whole RL loop in LoRA mode through our own client, over http and over ray (issue 25).

Each transport gets its own local-backend server with a training (DeepSpeed + peft), a
sampling (vLLM LoRA) and a log-prob (vLLM LoRA) job of the tiny model, all made from one
client config with ``training_config={"lora": {"rank": 8}}``. The tests run in file order on
those jobs: the base is served before any sync; generate -> log_probs -> fwd_bwd -> step ->
sync_weights moves only the adapter (156,960 bytes a target at rank 8, against 1,748,480 for
the full weights) and every job then scores alike; old versions and a second adapter stay
served; a SIGKILLed trainer resumes from its checkpoint and its targets get the restored
adapter.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.clients import client_config, local_client
from support.rollouts import (
    assert_log_prob_job_agrees,
    assert_scores_agree,
    fixed_row_scores,
    max_gap,
    rollouts,
    score_gap,
)
from workers import kill_worker_and_wait_failed

from arctic_platform.rl.errors import ServerError

pytestmark = pytest.mark.slow

ADAPTER_BYTES = 156_960  # 30 fp32 tensors, 39,240 parameters (rank 8, default targets)
FULL_BYTES = 1_748_480  # the tiny model's full fp32 weights
PROMPTS = ["12 + 30 =", "the sum of digits", "write a number"]
SAMPLE = {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 3}
GREEDY = {"n": 1, "max_tokens": 8, "temperature": 0.0}
FIXED_TOLERANCE = 1e-4  # nats: jobs serving the same float32 adapter score fixed rows alike
LORA_TRAINING = {"optimizer": {"lr": 1e-2}, "lora": {"rank": 8}}


@pytest.fixture(scope="module", params=["http", "ray"])
def lora(request, tiny_model_path, tmp_path_factory):
    """``(client, notes)``: a LoRA run's client (all three jobs running) on its own server for
    the transport, and what one test leaves the next."""
    from arctic_platform.rl.testing import free_port

    if request.param == "http":
        fields = {"port": free_port()}
    else:
        fields = {"comm_protocol": "ray", "host": None}
    config = client_config(tiny_model_path, training_config=LORA_TRAINING, **fields)
    with local_client(tmp_path_factory.mktemp(f"lora-{request.param}"), config) as client:
        yield client, {}


def _scores(answer: dict) -> list[list[float]]:
    return [out["log_probs"] for out in answer["outputs"]]


def test_before_any_sync_every_job_serves_the_base_model(lora):
    client, notes = lora
    gen = client.generate(PROMPTS, SAMPLE)
    assert gen["weight_version"] == 0 and gen["adapter"] == "base"
    rows = rollouts(gen["outputs"])
    notes["rows"] = rows
    # the fresh adapter is zero (lora_B = 0): trainer, sampler and log-prob job agree
    notes["base"] = assert_log_prob_job_agrees(client, rows)
    for job_type in ("sampling", "log_prob"):
        assert client.job_info(job_type)["adapter_versions"] == {}


def _pushed(rows, every: int, by: float) -> tuple[list[list[float]], list[tuple[int, int]]]:
    """The sampler's log-probs with every ``every``-th trained token's raised by ``by`` nats
    (a sampler that disagrees there), and which (row, position) those are."""
    out, moved = [], []
    for i, (lps, p) in enumerate(zip(rows.rollout_log_probs(), rows.prompt_lengths, strict=True)):
        row = list(lps)
        for j in range(p, len(row)):
            if (j - p) % every == 0:
                row[j] += by
                moved.append((i, j))
        out.append(row)
    return out, moved


def test_a_rollout_correction_weights_rejects_and_refuses_through_the_real_engine(lora):
    """A rejected token leaves the loss and its normaliser: the same loss as the batch with
    those tokens masked out by hand. Presets report their weights; a correction that makes no
    sense is a 422 naming the field and changes nothing."""
    client, notes = lora
    rows, old = notes["rows"], notes["base"]
    pushed, moved = _pushed(rows, every=3, by=1.0)  # ratio there: e^-1, outside [0.5, 2]
    assert moved
    batch = rows.batch(old_log_probs=old, rollout_log_probs=pushed)
    rules = {"rollout_rs": {"token_ratio": [0.5, 2.0]}}
    before = client.fwd_bwd(batch, loss_fn="ppo", forward_only=True)
    rejected = client.fwd_bwd(batch, loss_fn="ppo", loss_config=rules, forward_only=True)
    by_hand = [list(m) for m in rows.loss_mask]
    for i, j in moved:
        by_hand[i][j] = 0
    masked = client.fwd_bwd({**batch, "loss_mask": by_hand}, loss_fn="ppo", forward_only=True)
    assert rejected["loss"] == pytest.approx(masked["loss"], rel=1e-6)
    assert rejected["tokens"] == masked["tokens"] < before["tokens"]
    assert rejected["rollout_rs_masked"] == pytest.approx(len(moved) / before["tokens"])
    assert before["mismatch_ratio.min"] == pytest.approx(math.exp(-1.0), rel=1e-3)

    tis = client.fwd_bwd(
        batch, loss_fn="grpo", loss_config={"rollout_correction": "token_tis"}, forward_only=True
    )
    assert tis["rollout_is_weight.min"] == pytest.approx(math.exp(-1.0), rel=1e-3)
    assert tis["rollout_is_weight.max"] == pytest.approx(1.0, abs=1e-3)
    assert 0.0 < tis["rollout_is_ess"] < 1.0
    # the same weights normalised over the whole batch: mean 1, the loss scaled alike (one
    # sign of advantage, so the policy-gradient term does not cancel to rounding noise)
    positive = {**batch, "advantages": [1.0] * len(batch["advantages"])}
    tis = client.fwd_bwd(
        positive, loss_fn="grpo", loss_config={"rollout_correction": "token_tis"}, forward_only=True
    )
    normal = {"rollout_correction": "token_tis", "rollout_is_batch_normalize": True}
    normed = client.fwd_bwd(positive, loss_fn="grpo", loss_config=normal, forward_only=True)
    assert normed["rollout_is_weight"] == pytest.approx(1.0, rel=1e-6)
    assert normed["rollout_is_scale"] == pytest.approx(1 / tis["rollout_is_weight"], rel=1e-6)
    assert abs(tis["pg_loss"]) > 0.1
    scaled = normed["rollout_is_scale"] * tis["pg_loss"]
    assert normed["pg_loss"] == pytest.approx(scaled, rel=1e-5)
    assert normed["rollout_is_ess"] == pytest.approx(tis["rollout_is_ess"], rel=1e-6)

    bad = [
        ({"rollout_correction": "tis"}, "rollout_correction"),
        ({"rollout_is": "token", "rollout_is_cap": 0}, "rollout_is_cap"),
        ({"rollout_rs": {"token_ratio": [2.0, 0.5]}}, "token_ratio"),
    ]
    for config, field in bad:
        with pytest.raises(ServerError, match=field) as refused:
            client.fwd_bwd(batch, loss_fn="grpo", loss_config=config)
        assert refused.value.status_code == 422
    with pytest.raises(ServerError, match="old_log_probs") as refused:
        client.fwd_bwd(rows.batch(rollout_log_probs=pushed), loss_fn="grpo", loss_config=normal)
    assert refused.value.status_code == 422
    no_rollout = rows.batch(old_log_probs=old)
    with pytest.raises(ServerError, match="rollout_log_probs") as refused:
        client.fwd_bwd(no_rollout, loss_fn="grpo", loss_config={"rollout_correction": "seq_tis"})
    assert refused.value.status_code == 422
    short = {**batch, "rollout_log_probs": [row[:-1] for row in pushed]}
    with pytest.raises(ServerError, match="rollout_log_probs") as refused:
        client.fwd_bwd(short, loss_fn="grpo")
    assert refused.value.status_code == 422
    after = client.fwd_bwd(batch, loss_fn="ppo", forward_only=True)
    assert after["loss"] == before["loss"]  # the job still serves, its weights as they were


def test_fwd_bwd_step_and_an_adapter_only_sync_reach_every_job(lora):
    client, notes = lora
    rows = notes["rows"]
    for step in range(3):
        batch = rows.batch(old_log_probs=notes["base"], rollout_log_probs=rows.rollout_log_probs())
        metrics = client.fwd_bwd(batch, loss_fn="grpo")
        assert "loss" in metrics
        # the sampler's own log-probs beside the old ones: the mismatch of the same weights
        # (fp32 on both sides) is at the 1e-6 level, and k3 >= 0
        assert 0.0 <= metrics["mismatch_k3"] < 1e-4 and abs(metrics["mismatch_k1"]) < 1e-3
        assert metrics["mismatch_ratio"] == pytest.approx(1.0, abs=1e-3)
        if step == 0:
            print(f"LoRA base, vLLM vs DeepSpeed: k3 {metrics['mismatch_k3']:.2e}")
        client.step()
    synced = client.sync_weights()
    assert synced["adapter"] == "default" and synced["weight_version"] == 1
    assert synced["strategy"] == "adapter"  # loaded under a new name: nothing drained
    # each of the two targets got the adapter's bytes, a tenth of the full weights' or less
    assert synced["bytes"] == 2 * ADAPTER_BYTES
    assert synced["bytes"] * 10 < 2 * FULL_BYTES

    after = client.generate(PROMPTS, GREEDY)
    assert after["weight_version"] == 1 and after["adapter"] == "default"
    assert_scores_agree(client, after["outputs"])  # trainer = sampler = log-prob job

    tuned = client.log_probs(rows.prompts, rows.completions)
    base = client.log_probs(rows.prompts, rows.completions, adapter="base")
    assert tuned["weight_version"] == 1 and base["weight_version"] == 0
    assert max_gap(notes["base"], _scores(base), rows.prompt_lengths) < 1e-3
    assert max_gap(notes["base"], _scores(tuned), rows.prompt_lengths) > 1e-3
    notes["v1"] = _scores(tuned)


def test_old_versions_and_a_second_adapter_stay_served(lora):
    client, notes = lora
    rows = notes["rows"]
    client.fwd_bwd(rows.batch(), loss_fn="grpo")
    client.step()
    second = client.sync_weights(adapter="second")
    assert second["adapter"] == "second" and second["weight_version"] == 1
    latest = client.sync_weights()
    assert latest["weight_version"] == 2
    for job_type in ("sampling", "log_prob"):
        info = client.job_info(job_type)
        assert info["adapter_versions"] == {"default": 2, "second": 1}
        assert info["weight_version"] == 2

    v1 = client.log_probs(rows.prompts, rows.completions, adapter="default", adapter_version=1)
    assert v1["weight_version"] == 1
    for old, now in zip(notes["v1"], _scores(v1), strict=True):
        assert now == pytest.approx(old, abs=1e-6)
    same = client.log_probs(rows.prompts, rows.completions, adapter="second")
    newest = client.log_probs(rows.prompts, rows.completions)
    assert same["adapter"] == "second" and newest["weight_version"] == 2
    for a, b in zip(_scores(same), _scores(newest), strict=True):
        assert a == pytest.approx(b, abs=1e-6)  # both hold the trainer's adapter of now
    gen = client.generate(PROMPTS, GREEDY, adapter="default", adapter_version=1)
    assert gen["weight_version"] == 1


def test_a_named_adapter_trains_apart_syncs_under_its_name_and_goes_away(lora):
    client, notes = lora
    rows = notes["rows"]
    assert sorted(client.add_adapter("other", seed=5)) == ["default", "other"]
    with pytest.raises(ServerError, match="already exists") as taken:
        client.add_adapter("other")
    assert taken.value.status_code == 422
    before = client.fwd_no_grad({"input_ids": rows.input_ids}, adapter="other")
    base = _scores(client.log_probs(rows.prompts, rows.completions, adapter="base"))
    assert max_gap(before, base, rows.prompt_lengths) < 1e-3  # a new adapter starts as the base
    for _ in range(2):
        client.fwd_bwd(rows.batch(old_log_probs=notes["base"]), loss_fn="grpo", adapter="other")
        client.step(adapter="other")
    synced = client.sync_weights(training_adapter="other")
    assert synced["adapter"] == "other" and synced["weight_version"] == 1
    assert synced["bytes"] == 2 * ADAPTER_BYTES
    trainer = client.fwd_no_grad({"input_ids": rows.input_ids}, adapter="other")
    served = _scores(client.log_probs(rows.prompts, rows.completions, adapter="other"))
    assert max_gap(trainer, served, rows.prompt_lengths) < 1e-4  # its own trainer
    default = client.fwd_no_grad({"input_ids": rows.input_ids}, adapter="default")
    assert max_gap(default, served, rows.prompt_lengths) > 1e-3  # not the default's
    client.remove_adapter("other")
    for job_type in ("sampling", "log_prob"):
        assert "other" not in client.job_info(job_type)["adapter_versions"]
    for gone in (
        lambda: client.log_probs(rows.prompts, rows.completions, adapter="other"),
        lambda: client.step(adapter="other"),
    ):
        with pytest.raises(ServerError, match="other") as missing:
            gone()
        assert missing.value.status_code == 404
    after = client.fwd_no_grad({"input_ids": rows.input_ids})  # the default is live again
    assert after == default


def test_a_killed_trainer_resumes_from_its_checkpoint_and_its_targets_get_the_adapter(lora):
    client, notes = lora
    rows = notes["rows"]
    path = client.save_checkpoint()
    assert (Path(path) / "adapter" / "adapter_model.safetensors").is_file()
    saved = client.job_info("training")["global_step"]
    old = fixed_row_scores(client, ("training",))["training"]  # the checkpoint's adapter
    expected = client.fwd_bwd(rows.batch(), loss_fn="grpo")["loss"]
    client.step()
    client.sync_weights()  # the targets now serve a step the crash loses (version 3)
    lost = fixed_row_scores(client)
    assert score_gap(lost["sampling"], lost["training"]) <= FIXED_TOLERANCE
    # the checks after the restart can tell the lost adapter from the restored one
    assert score_gap(lost["training"], old) >= 10 * FIXED_TOLERANCE

    kill_worker_and_wait_failed(client, "training")
    restarted = client.restart_job("training")  # waits for the resync of its targets
    assert restarted["global_step"] == saved and restarted["resync_pending"] == []
    assert "restored weights synced into jobs" in restarted["weights_from"]
    for job_type in ("sampling", "log_prob"):
        info = client.job_info(job_type)
        assert info["adapter_versions"]["default"] == 4, job_type
        assert "after its restart from checkpoint" in info["weights_from"]
    after = client.generate(PROMPTS, GREEDY)
    assert after["weight_version"] == 4 and after["adapter"] == "default"
    assert_scores_agree(client, after["outputs"])  # the restored adapter everywhere
    restored = fixed_row_scores(client)
    assert score_gap(restored["training"], old) <= FIXED_TOLERANCE
    for job_type in ("sampling", "log_prob"):
        assert score_gap(restored[job_type], restored["training"]) <= FIXED_TOLERANCE, job_type
    again = client.fwd_bwd(rows.batch(), loss_fn="grpo")["loss"]
    assert again == pytest.approx(expected, rel=1e-5)  # the same state as when it was saved
