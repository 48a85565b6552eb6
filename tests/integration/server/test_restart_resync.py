"""A SIGKILLed trainer restarted from its checkpoint brings its samplers back to its weights.

On the session's shared live server (http; training, sampling and log-prob jobs): the trainer
saves a checkpoint, trains one step past it and syncs, so sampler and log-prob job serve that
newer step; then its worker is SIGKILLed and ``restart_job("training")`` brings it back at the
checkpoint. Before issue 25 the samplers kept serving the lost step until the next sync (weight
norms 28.5522 vs 28.5613, as a user saw); now the server syncs the restored weights into them
under a new weight version, and ``weights_from`` says so.
"""

from __future__ import annotations

import pytest
from support.rollouts import fixed_row_scores, score_gap
from workers import kill_worker_and_wait_failed

pytestmark = pytest.mark.slow

PROMPTS = ["12 + 30 =", "the sum of digits"]
TOLERANCE = 1e-4  # nats: jobs holding the same float32 weights score fixed tokens alike
STEP_LR = 1e-2  # the step past the checkpoint (which the restart discards) is made visible


def test_a_restarted_trainer_syncs_its_restored_weights_into_the_jobs_it_synced_into(live):
    live.settle()
    client = live.client
    saved_path = client.save_checkpoint()
    saved = client.job_info("training")["global_step"]
    at_checkpoint = client.weight_norm()["training"]
    old = fixed_row_scores(client, ("training",))["training"]

    # one step past the checkpoint, synced: the samplers serve weights the crash will lose
    client.fwd_bwd({"input_ids": [[1, 5, 6, 7, 8], [1, 9, 10]], "advantages": [1.0, -1.0]})
    assert client.step(learning_rate=STEP_LR)["global_step"] == saved + 1
    lost = client.sync_weights()["weight_version"]
    newer = fixed_row_scores(client)
    for job_type in ("sampling", "log_prob"):
        assert score_gap(newer[job_type], newer["training"]) <= TOLERANCE, job_type
    # the check below can tell the lost weights from the restored ones: the step moved the
    # scores by ten times the tolerance at least
    moved = score_gap(newer["training"], old)
    assert moved >= 10 * TOLERANCE, moved

    kill_worker_and_wait_failed(client, "training")
    restarted = client.restart_job("training")  # waits until it runs and has resynced
    assert restarted["state"] == "running" and restarted["global_step"] == saved
    assert client.weight_norm()["training"] == pytest.approx(at_checkpoint, rel=1e-6)
    restored = fixed_row_scores(client)
    assert score_gap(restored["training"], old) <= TOLERANCE
    for job_type in ("sampling", "log_prob"):
        assert score_gap(restored[job_type], restored["training"]) <= TOLERANCE, job_type

    assert restarted["resync_pending"] == []
    assert restarted["weights_from"].startswith(f"checkpoint {saved_path}")
    assert "restored weights synced into jobs" in restarted["weights_from"]
    for job_type in ("sampling", "log_prob"):
        info = client.job_info(job_type)
        assert info["weight_version"] == lost + 1, job_type  # a new version for the restored
        assert f"after its restart from checkpoint {saved_path}" in info["weights_from"]
    assert client.generate(PROMPTS, {"n": 1, "max_tokens": 4})["weight_version"] == lost + 1
