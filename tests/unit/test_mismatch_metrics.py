"""Sampler/trainer mismatch metrics (issue 34 item 3, first part) against hand computations on
the tiny batch of ``test_losses``: three trained tokens, sampler probabilities chosen so each
metric is a short sum."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from arctic_platform.rl.batch import Batch, BatchError  # noqa: E402
from arctic_platform.rl.loss_metrics import (  # noqa: E402
    MISMATCH_METRICS,
    mismatch_extrema,
    mismatch_metrics,
)
from arctic_platform.rl.losses import (  # noqa: E402
    make_grpo,
    make_importance_sampling,
    make_ppo,
)

# Trained tokens (row, position): (0, 1), (0, 2), (1, 2). Trainer (old) probabilities there:
# 0.4, 0.25, 0.2; the sampler's: 0.5, 0.25, 0.1. Position 0 and untrained positions hold
# values that must not count.
MASK = [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
TRAIN = [[0.0, math.log(0.4), math.log(0.25)], [0.0, math.log(0.8), math.log(0.2)]]
ROLLOUT = [[-9.0, math.log(0.5), math.log(0.25)], [-9.0, math.log(0.3), math.log(0.1)]]
PAIRS = [(0.4, 0.5), (0.25, 0.25), (0.2, 0.1)]  # (trainer, sampler) per trained token


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _by_hand() -> dict[str, float]:
    """Each metric's token mean, from the three (trainer, sampler) probability pairs."""
    d = [math.log(q) - math.log(p) for p, q in PAIRS]  # rollout - train
    r = [p / q for p, q in PAIRS]  # pi / mu
    n = len(PAIRS)
    return {
        "mismatch_k1": sum(d) / n,
        "mismatch_k2": sum(x * x / 2 for x in d) / n,
        "mismatch_k3": sum(ri - 1 + di for ri, di in zip(r, d, strict=True)) / n,
        "mismatch_ratio": sum(r) / n,
        "mismatch_chi2": sum((ri - 1) ** 2 for ri in r) / n,
        # per row: row 0 trains the first two pairs, row 1 the third
        "mismatch_chi2_seq": ((r[0] * r[1]) ** 2 - 1 + r[2] ** 2 - 1) / 2,
        "rollout_log_ppl": -sum(math.log(q) for _, q in PAIRS) / n,
        "train_log_ppl": -sum(math.log(p) for p, _ in PAIRS) / n,
    }


def _batch(**fields: torch.Tensor) -> dict[str, object]:
    """The two-row batch the losses train (mask ``MASK``, advantages 1 and -2), with ``fields``
    (old or rollout log-probs)."""
    advantages = _t([[1.0] * 3, [-2.0] * 3])
    return {
        "loss_mask": _t(MASK),
        "advantages": advantages,
        **fields,
        "num_tokens": 3.0,
        "num_seqs": 2.0,
    }


def _means(metrics: dict) -> dict[str, float]:
    return {k: float(s) / float(c) for k, (s, c) in metrics.items() if k in MISMATCH_METRICS}


def test_each_mismatch_metric_equals_its_hand_computation():
    got = _means(mismatch_metrics(_t(TRAIN), _t(ROLLOUT), _t(MASK)))
    expected = _by_hand()
    assert set(got) == set(MISMATCH_METRICS)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    assert expected["mismatch_k3"] > 0 and expected["mismatch_chi2"] > 0


def test_equal_log_probs_give_no_mismatch():
    same = mismatch_metrics(_t(TRAIN), _t(TRAIN), _t(MASK))
    got = _means(same)
    for name in ("mismatch_k1", "mismatch_k2", "mismatch_k3", "mismatch_chi2"):
        assert got[name] == 0.0, name
    assert got["mismatch_ratio"] == 1.0


@pytest.mark.parametrize("loss", [make_grpo, make_ppo, make_importance_sampling])
def test_every_policy_gradient_loss_reports_the_mismatch_against_the_old_policy(loss):
    """Decoupled: ``old_log_probs`` is the trainer's side; the loss itself is unchanged."""
    fn = loss()
    config = fn.configure(None)
    current = torch.tensor(TRAIN, dtype=torch.float64, requires_grad=True) + 0.01
    base = _batch(old_log_probs=_t(TRAIN))
    plain = fn(current, base, **config)
    out = fn(current, {**base, "rollout_log_probs": _t(ROLLOUT)}, **config)
    assert float(out.loss) == float(plain.loss)  # metrics only: no correction
    got = _means(out.metrics)
    for name, value in _by_hand().items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    assert not any(name in plain.metrics for name in MISMATCH_METRICS)


def test_without_old_log_probs_the_current_policy_is_the_trainers_side():
    """Bypass: the rollout log-probs are measured against the log-probs being trained."""
    fn = make_importance_sampling()
    batch = _batch(rollout_log_probs=_t(ROLLOUT))
    current = torch.tensor(TRAIN, dtype=torch.float64, requires_grad=True)
    out = fn(current, batch, **fn.configure(None))
    assert _means(out.metrics)["mismatch_k1"] == pytest.approx(_by_hand()["mismatch_k1"])
    out.loss.backward()  # the metrics hold no graph: the gradient is the loss's alone
    assert current.grad is not None


def test_a_batch_takes_rollout_log_probs_per_token_and_refuses_the_wrong_length():
    fields = {"input_ids": [[1, 2, 3], [4, 5, 6]], "loss_mask": MASK, "advantages": [1.0, -2.0]}
    built = Batch.build({**fields, "rollout_log_probs": ROLLOUT})
    assert "rollout_log_probs" in built
    with pytest.raises(BatchError, match="rollout_log_probs"):
        Batch.build({**fields, "rollout_log_probs": [[0.0, -1.0], [0.0, -1.0, -2.0]]})


def test_a_float32_gap_of_1e_7_gives_a_small_positive_k3_not_rounding_noise():
    """Engines that agree differ by ~1e-7 nats in float32: k3 is ~d^2/2, never negative."""
    mask = torch.ones((1, 64), dtype=torch.float32)
    train = torch.full((1, 64), -2.0, dtype=torch.float32)
    rollout = train + torch.linspace(-3e-7, 3e-7, 64, dtype=torch.float32)
    total, _ = mismatch_metrics(train, rollout, mask)["mismatch_k3"]
    d = (rollout.double() - train.double())[0]
    assert float(total) > 0
    assert float(total) == pytest.approx(float((d * d / 2).sum()), rel=1e-3)


def test_the_ratio_extrema_are_the_least_and_greatest_trained_token_ratio():
    low, high = mismatch_extrema(_t(TRAIN), _t(ROLLOUT), _t(MASK))["mismatch_ratio"]
    ratios = [p / q for p, q in PAIRS]
    assert (float(low), float(high)) == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
    empty = mismatch_extrema(_t(TRAIN), _t(ROLLOUT), torch.zeros(2, 3, dtype=torch.float64))
    assert [float(v) for v in empty["mismatch_ratio"]] == [math.inf, -math.inf]
