"""How the training engine folds a loss's metrics over micro-batches (one rank): sums and
counts add up, extrema keep the least and greatest, and the effective sample size of a rollout
correction's weights comes from the reduced means."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from arctic_rl_engines.ds_metrics import add_extrema, add_metrics, reduce_metrics  # noqa: E402


def _pair(a: float, b: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(a), torch.tensor(b)


def test_extrema_keep_the_least_and_greatest_over_micro_batches():
    sums: dict = {}
    lows_highs: dict = {}
    add_metrics(
        sums, {"rollout_is_weight": _pair(3.0, 2.0), "rollout_is_weight_sq": _pair(5.0, 2.0)}
    )
    add_extrema(lows_highs, {"rollout_is_weight": _pair(1.0, 2.0)})
    add_metrics(
        sums, {"rollout_is_weight": _pair(1.0, 2.0), "rollout_is_weight_sq": _pair(0.5, 2.0)}
    )
    add_extrema(lows_highs, {"rollout_is_weight": _pair(0.25, 0.75)})
    add_extrema(lows_highs, {"mismatch_ratio": _pair(math.inf, -math.inf)})  # no token reached
    out = reduce_metrics(sums, 4.0, 2.0, 3, 1, lows_highs)
    assert out["rollout_is_weight"] == 1.0  # (3 + 1) / 4
    assert (out["rollout_is_weight.min"], out["rollout_is_weight.max"]) == (0.25, 2.0)
    # weights summing to 4 over 4 tokens, squares to 5.5: ESS = mean^2 / mean of squares
    assert out["rollout_is_ess"] == pytest.approx(1.0**2 / (5.5 / 4))
    assert "mismatch_ratio.min" not in out and "mismatch_ratio.max" not in out


def test_no_weights_no_effective_sample_size():
    out = reduce_metrics({"loss": [torch.tensor(1.0), torch.tensor(2.0)]}, 2.0, 1.0, 1, 1)
    assert "rollout_is_ess" not in out and out["loss"] == 0.5
