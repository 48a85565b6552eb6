"""The server's sync_weights over real engines (the session's shared server): the second sync
reuses the kept pair worlds and still delivers the new weights to every replica."""

from __future__ import annotations

import pytest
from support.rollouts import fixed_row_scores, rollouts, score_gap

from arctic_platform.rl.client import ArcticRLClient

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # nats: jobs holding the same float32 weights score fixed tokens alike


@pytest.fixture(scope="module")
def client(live):
    """The session's shared server (its first sync happens here: ``live_first``)."""
    return live.client


def _train_step(client: ArcticRLClient) -> None:
    gen = client.generate(["12 + 30 =", "write a number"], {"n": 2, "max_tokens": 6, "seed": 1})
    rows = rollouts(gen["outputs"])
    old = client.fwd_no_grad({"input_ids": rows.input_ids})
    client.fwd_bwd(rows.batch(old_log_probs=old), loss_fn="grpo")
    client.step()


@pytest.mark.live_first  # the shared jobs' first sync: no pair world is kept yet
def test_second_sync_reuses_the_pair_worlds_and_moves_the_new_weights(client):
    first = client.sync_weights()
    assert first["reused_connections"] == 0 and first["strategy"] == "drain"
    norms = client.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    synced = fixed_row_scores(client)
    for job_type in ("sampling", "log_prob"):
        assert score_gap(synced[job_type], synced["training"]) <= TOLERANCE, job_type

    _train_step(client)
    changed = fixed_row_scores(client)
    # before the second sync the samplers still serve the old weights, and the step moved
    # the scores by ten times the tolerance at least: the check after the sync can tell
    for job_type in ("sampling", "log_prob"):
        stale = score_gap(changed[job_type], changed["training"])
        assert stale >= 10 * TOLERANCE, (job_type, stale)
    second = client.sync_weights()
    assert second["weight_version"] == first["weight_version"] + 1
    assert second["reused_connections"] == 2  # the sampling and the log-prob replica
    assert second["bytes"] == first["bytes"] and second["bandwidth_gbps"] > 0
    norms = client.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-5)
    fresh = fixed_row_scores(client)
    for job_type in ("sampling", "log_prob"):
        assert score_gap(fresh[job_type], fresh["training"]) <= TOLERANCE, job_type
    assert (
        client.generate(["12 + 30 ="], {"n": 1, "max_tokens": 4})["weight_version"]
        == (second["weight_version"])
    )
