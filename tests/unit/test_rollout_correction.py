"""Rollout correction (issue 34 item 2): every weighting and rejection mode against a hand
computation on one fixed batch, the gradient of a corrected loss against the weighted gradient,
presets, the normalisers the engine uses, and the config errors.

The batch: two rows of four positions. Row 0 trains positions 1-3, row 1 positions 2-3. The
trainer's probabilities ``p`` and the sampler's ``q`` there give token ratios ``rho = p/q`` of
2, 0.5, 1 (row 0; product 1) and 4, 1.5 (row 1; product 6, geometric mean sqrt(6)).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from arctic_platform.rl.errors import LossConfigError  # noqa: E402
from arctic_platform.rl.losses import (  # noqa: E402
    make_cispo,
    make_dro,
    make_grpo,
    make_importance_sampling,
    make_ppo,
)
from arctic_platform.rl.rollout_correction import (  # noqa: E402
    PRESETS,
    batch_weight_scale,
    check_correction,
    correct,
    effective_sample_size,
)

MASK = [[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
P = [[0.9, 0.4, 0.1, 0.3], [0.9, 0.7, 0.8, 0.6]]
Q = [[0.5, 0.2, 0.2, 0.3], [0.5, 0.2, 0.2, 0.4]]
RHO = [[2.0, 0.5, 1.0], [4.0, 1.5]]  # over each row's trained tokens
ADV = [1.0, -2.0]


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _log(rows: list[list[float]]) -> torch.Tensor:
    return torch.log(_t(rows))


def _trained(values: torch.Tensor) -> list[list[float]]:
    """``values`` at each row's trained positions."""
    return [[float(values[0, j]) for j in (1, 2, 3)], [float(values[1, j]) for j in (2, 3)]]


def _correct(**config):
    full = {"rollout_is_mode": "truncate", "rollout_is_cap": 2.0, "rollout_is_floor": 0.0}
    full.update(config)
    check_correction(full)
    return correct(_log(P), _log(Q), _t(MASK), full)


def _approx(got: list[list[float]], expected: list[list[float]]) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-12)


def test_the_batch_has_the_ratios_the_docstring_says():
    rho = torch.exp(_log(P) - _log(Q))
    _approx(_trained(rho), RHO)


@pytest.mark.parametrize(
    ("config", "weights"),
    [
        ({"rollout_is": "token"}, [[2.0, 0.5, 1.0], [2.0, 1.5]]),
        ({"rollout_is": "token", "rollout_is_floor": 0.75}, [[2.0, 0.75, 1.0], [2.0, 1.5]]),
        ({"rollout_is": "sequence"}, [[1.0, 1.0, 1.0], [2.0, 2.0]]),
        ({"rollout_is": "sequence", "rollout_is_cap": 10.0}, [[1.0, 1.0, 1.0], [6.0, 6.0]]),
        (  # IcePop: the ratio inside the band, 0 outside
            {
                "rollout_is": "token",
                "rollout_is_mode": "mask",
                "rollout_is_floor": 0.6,
                "rollout_is_cap": 3.0,
            },
            [[2.0, 0.0, 1.0], [0.0, 1.5]],
        ),
        (  # TRL's sequence mask: the sequence ratio below the cap, 0 above
            {"rollout_is": "sequence", "rollout_is_mode": "mask", "rollout_is_cap": 3.0},
            [[1.0, 1.0, 1.0], [0.0, 0.0]],
        ),
    ],
)
def test_each_weighting_mode_equals_its_hand_computation(config, weights):
    got = _correct(**config)
    _approx(_trained(got.weights), weights)
    assert _trained(got.keep) == [[1.0] * 3, [1.0] * 2]  # weighting drops nothing
    flat = [w for row in weights for w in row]
    total, count = got.metrics["rollout_is_weight"]
    assert float(total) / float(count) == pytest.approx(sum(flat) / 5)
    low, high = got.extrema["rollout_is_weight"]
    assert (float(low), float(high)) == (pytest.approx(min(flat)), pytest.approx(max(flat)))
    sq_total, _ = got.metrics["rollout_is_weight_sq"]
    ess = effective_sample_size(
        {"rollout_is_weight": float(total) / 5, "rollout_is_weight_sq": float(sq_total) / 5}
    )
    assert ess == pytest.approx(sum(flat) ** 2 / (5 * sum(w * w for w in flat)))


def test_the_clipped_share_counts_tokens_whose_raw_weight_left_the_band():
    got = _correct(rollout_is="token")  # cap 2: only rho = 4 is above
    total, count = got.metrics["rollout_is_clipped"]
    assert (float(total), float(count)) == (1.0, 5.0)


def _k3(r: float) -> float:
    return r - 1.0 - math.log(r)


@pytest.mark.parametrize(
    ("rules", "keep"),
    [
        ({"token_ratio": [0.6, 3.0]}, [[1, 0, 1], [0, 1]]),
        ({"token_ratio": 3.0}, [[1, 1, 1], [0, 1]]),  # u alone: [1/3, 3]
        ({"seq_ratio": [0.5, 2.0]}, [[1, 1, 1], [0, 0]]),
        ({"geo_ratio": [0.9, 1.1]}, [[1, 1, 1], [0, 0]]),
        ({"geo_ratio": [0.9, None]}, [[1, 1, 1], [1, 1]]),
        ({"geo_ratio": [0.5, 3.0]}, [[1, 1, 1], [1, 1]]),  # sqrt(6) inside, 6 is not
        ({"seq_ratio": [0.5, 3.0]}, [[1, 1, 1], [0, 0]]),
        ({"seq_token_ratio": [0.6, None]}, [[0, 0, 0], [1, 1]]),
        ({"token_k3": 0.2}, [[0, 1, 1], [0, 1]]),
        ({"token_k2": 0.5 * math.log(1.6) ** 2}, [[0, 0, 1], [0, 1]]),
        ({"seq_mean_k3": 0.2}, [[1, 1, 1], [0, 0]]),
        ({"seq_sum_k3": 0.4}, [[0, 0, 0], [0, 0]]),
        ({"seq_sum_k3": 0.6}, [[1, 1, 1], [0, 0]]),
        ({"seq_max_k3": 0.25}, [[0, 0, 0], [0, 0]]),
        ({"seq_max_k3": 0.31}, [[1, 1, 1], [0, 0]]),
        ({"seq_max_k2": 0.5 * math.log(2.0) ** 2 + 1e-9}, [[1, 1, 1], [0, 0]]),
        ({"token_ratio": [0.6, 3.0], "seq_token_ratio": [0.6, None]}, [[0, 0, 0], [0, 1]]),
    ],
)
def test_each_rejection_rule_keeps_the_tokens_a_hand_computation_keeps(rules, keep):
    assert _k3(2.0) == pytest.approx(0.3069, abs=1e-4)  # the hand figures the bounds sit on
    assert (_k3(2.0) + _k3(0.5)) == pytest.approx(0.5, abs=1e-3)
    got = _correct(rollout_rs=rules)
    assert _trained(got.keep) == [[float(k) for k in row] for row in keep]
    assert _trained(got.weights) == [[float(k) for k in row] for row in keep]
    dropped, tokens = got.metrics["rollout_rs_masked"]
    assert (float(dropped), float(tokens)) == (5 - sum(map(sum, keep)), 5.0)
    rows_dropped, rows = got.metrics["rollout_rs_seq_masked"]
    assert (float(rows_dropped), float(rows)) == (sum(1 for r in keep if not any(r)), 2.0)
    assert "rollout_is_weight" not in got.metrics  # no weighting asked for


def _batch(current_shift: float = 0.3) -> tuple[torch.Tensor, dict]:
    """Current log-probs (a leaf) moved off the old ones, and the batch (old = the trainer's
    ``P``, rollout = the sampler's ``Q``); ``num_tokens``/``num_seqs`` over the whole mask."""
    old = _log(P)
    current = (old + current_shift * _t(MASK)).clone().requires_grad_(True)
    batch = {
        "loss_mask": _t(MASK),
        "advantages": _t([[ADV[0]] * 4, [ADV[1]] * 4]),
        "old_log_probs": old,
        "rollout_log_probs": _log(Q),
        "num_tokens": 5.0,
        "num_seqs": 2.0,
    }
    return current, batch


def test_the_gradient_with_token_weights_is_the_weighted_gradient():
    """importance_sampling, token-mean: L = -sum w A exp(lp - old) / N, so dL/dlp = -w A r / N
    with the weights constant."""
    fn = make_importance_sampling()
    config = fn.configure({"rollout_correction": "token_tis"})
    current, batch = _batch()
    out = fn(current, batch, **config)
    out.loss.backward()
    r = math.exp(0.3)
    weights = [[2.0, 0.5, 1.0], [2.0, 1.5]]
    expected = [[-w * ADV[i] * r / 5 for w in row] for i, row in enumerate(weights)]
    _approx(_trained(current.grad), expected)
    assert float(out.loss) == pytest.approx(sum(map(sum, expected)))
    untrained = current.grad * (1 - _t(MASK))
    assert float(untrained.abs().sum()) == 0.0


LOSSES = [make_grpo, make_ppo, make_importance_sampling, make_cispo, make_dro]


@pytest.mark.parametrize("loss", LOSSES)
def test_every_policy_gradient_loss_gives_the_weighted_gradient_and_counts_weights_as_constants(
    loss,
):
    """Per token, a corrected loss's gradient is the uncorrected per-token gradient times the
    weight (the aggregation is linear in the per-token loss for a fixed mask). The weights
    scale the policy-gradient term only, so dro's quadratic penalty is off here."""
    fn = loss()
    extra = {"beta": 0.0} if fn.name == "dro" else {}
    plain_config = fn.configure(extra)
    corrected_config = fn.configure({"rollout_is": "sequence", "rollout_is_cap": 10.0, **extra})
    weights = [[1.0, 1.0, 1.0], [6.0, 6.0]]
    current, batch = _batch(current_shift=0.05)  # inside the clip range: no clipping
    fn(current, batch, **plain_config).loss.backward()
    plain = _trained(current.grad)
    current.grad = None
    fn(current, batch, **corrected_config).loss.backward()
    got = _trained(current.grad)
    expected = [
        [g * w for g, w in zip(gs, ws, strict=True)] for gs, ws in zip(plain, weights, strict=True)
    ]
    _approx(got, expected)


def test_a_rejected_token_leaves_the_loss_and_the_engine_normaliser():
    fn = make_ppo()  # token-mean
    config = fn.configure({"rollout_rs": {"token_ratio": [0.6, 3.0]}})
    current, batch = _batch(current_shift=0.0)
    counts = fn.normalisers(config, lambda: batch)
    assert counts == (3.0, 2.0)  # tokens rho = 2, 1 and 1.5 stay; both rows keep one
    batch["num_tokens"], batch["num_seqs"] = counts
    out = fn(current, batch, **config)
    out.loss.backward()
    # ratio 1, pg = -A per kept token: (-1 - 1 + 2) / 3
    assert float(out.loss) == pytest.approx((-1.0 - 1.0 + 2.0) / 3)
    _approx(_trained(current.grad), [[-1 / 3, 0.0, -1 / 3], [0.0, 2 / 3]])
    assert float(out.metrics["pg_loss"][1]) == 3.0  # the kept tokens


def test_the_geometric_mask_drops_a_row_from_grpos_sequence_mean():
    fn = make_grpo()  # seq-mean-token-mean
    config = fn.configure({"rollout_correction": "geo_rs", "rollout_rs": {"geo_ratio": 1.1}})
    current, batch = _batch(current_shift=0.0)
    assert fn.normalisers(config, lambda: batch) == (3.0, 1.0)
    batch["num_tokens"], batch["num_seqs"] = 3.0, 1.0
    out = fn(current, batch, **config)
    assert float(out.loss) == pytest.approx(-1.0)  # row 0 alone: mean of -A = -1
    total, rows = out.metrics["rollout_rs_seq_masked"]
    assert (float(total), float(rows)) == (1.0, 2.0)


def test_normalisers_are_left_to_the_engine_when_the_batch_alone_cannot_decide():
    fn = make_ppo()
    _, batch = _batch()
    no_old = {k: v for k, v in batch.items() if k != "old_log_probs"}
    rules = {"rollout_rs": {"token_ratio": [0.6, 3.0]}}
    assert fn.normalisers(fn.configure(rules), lambda: no_old) is None
    assert fn.normalisers(fn.configure({**rules, "rollout_bypass": True}), lambda: batch) is None
    assert fn.normalisers(fn.configure({"rollout_is": "token"}), lambda: batch) is None


def test_bypass_measures_the_ratio_against_the_sampler():
    """Bypass: old := rollout, so importance_sampling's ratio is pi/mu itself."""
    fn = make_importance_sampling()
    config = fn.configure({"rollout_correction": "bypass"})
    current, batch = _batch(current_shift=0.0)
    out = fn(current, batch, **config)
    ratio_sum, count = out.metrics["ratio"]
    assert float(ratio_sum) / float(count) == pytest.approx(sum(sum(r) for r in RHO) / 5)
    low, high = out.extrema["mismatch_ratio"]
    assert (float(low), float(high)) == (pytest.approx(0.5), pytest.approx(4.0))


def test_presets_fill_keys_that_the_call_may_override():
    fn = make_grpo()
    icepop = fn.configure({"rollout_correction": "icepop"})
    assert (icepop["rollout_is"], icepop["rollout_is_mode"]) == ("token", "mask")
    assert (icepop["rollout_is_floor"], icepop["rollout_is_cap"]) == (0.5, 5.0)
    tighter = fn.configure({"rollout_correction": "icepop", "rollout_is_cap": 3.0})
    assert tighter["rollout_is_cap"] == 3.0 and tighter["rollout_is_floor"] == 0.5
    for name in PRESETS:
        fn.configure({"rollout_correction": name})  # every preset is a valid config


def test_a_call_without_a_correction_trains_exactly_as_before():
    fn = make_grpo()
    current, batch = _batch()
    plain = fn(current, {k: v for k, v in batch.items() if k != "rollout_log_probs"})
    with_rollout = fn(current, batch)
    assert float(plain.loss) == float(with_rollout.loss)
    assert "mismatch_k3" in with_rollout.metrics and "mismatch_k3" not in plain.metrics


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"rollout_correction": "tis"}, "rollout_correction"),
        ({"rollout_is": "row"}, "rollout_is"),
        ({"rollout_is": "token", "rollout_is_mode": "clip"}, "rollout_is_mode"),
        ({"rollout_is": "token", "rollout_is_cap": 0}, "rollout_is_cap"),
        ({"rollout_is": "token", "rollout_is_cap": -1.0}, "rollout_is_cap"),
        ({"rollout_is": "token", "rollout_is_cap": float("inf")}, "rollout_is_cap"),
        ({"rollout_is": "token", "rollout_is_floor": 2.0}, "rollout_is_floor"),
        ({"rollout_is": "token", "rollout_bypass": True}, "rollout_bypass"),
        ({"rollout_bypass": "yes"}, "rollout_bypass"),
        ({"rollout_rs": {"token_ratio": [2.0, 0.5]}}, "exceeds high bound"),
        ({"rollout_rs": {"token_ratio": 0.5}}, "rollout_rs['token_ratio']"),
        ({"rollout_rs": {"token_ratio": [0.5]}}, "rollout_rs['token_ratio']"),
        ({"rollout_rs": {"token_k3": -0.1}}, "rollout_rs['token_k3']"),
        ({"rollout_rs": {"token_k1": 0.1}}, "unknown stat 'token_k1'"),
        ({"rollout_rs": {}}, "rollout_rs"),
        ({"rollout_rs": [["token_ratio", 2.0]]}, "rollout_rs"),
        ({"rollout_is_batch_normalize": True}, "needs importance weights"),
        ({"rollout_is": "token", "rollout_is_batch_normalize": 1}, "rollout_is_batch_normalize"),
    ],
)
def test_a_correction_that_makes_no_sense_is_refused_naming_the_field(config, field):
    for loss in LOSSES:
        with pytest.raises(LossConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
            loss().configure(config)


def test_a_correction_needs_the_rollout_log_probs():
    fn = make_ppo()
    config = fn.configure({"rollout_correction": "token_tis"})
    assert "rollout_log_probs" in fn.required_fields(config)
    assert "rollout_log_probs" not in fn.required_fields(fn.configure(None))
    current, batch = _batch()
    del batch["rollout_log_probs"]
    with pytest.raises(LossConfigError, match="rollout_log_probs"):
        fn(current, batch, **config)


@pytest.mark.parametrize(
    ("config", "scale"),
    [
        # token weights 2, .5, 1 | 2, 1.5 (cap 2): mean 7/5 over the five kept tokens
        ({"rollout_is": "token"}, 5 / 7),
        # sequence weights 1 | 6 (cap 10): mean 7/2 over the two rows, not over tokens
        ({"rollout_is": "sequence", "rollout_is_cap": 10.0}, 2 / 7),
        # rejected tokens leave the mean: the band [0.4, 1.2] keeps rho .5 and 1 -> mean .75
        ({"rollout_is": "token", "rollout_rs": {"token_ratio": [0.4, 1.2]}}, 4 / 3),
    ],
)
def test_batch_normalised_weights_have_mean_one_over_the_whole_batch_split_in_micro_batches(
    config, scale
):
    """The whole batch's scale makes the weights average 1 over its kept tokens (rows at
    sequence level), whichever micro-batches compute them."""
    full = {"rollout_is_mode": "truncate", "rollout_is_cap": 2.0, "rollout_is_floor": 0.0}
    full.update(config, rollout_is_batch_normalize=True)
    check_correction(full)
    got = batch_weight_scale(_log(P), _log(Q), _t(MASK), full)
    assert got == pytest.approx(scale, rel=1e-12)
    # each row as its own micro-batch, the whole batch's scale applied to both
    halves = [
        correct(_log(P)[i : i + 1], _log(Q)[i : i + 1], _t(MASK)[i : i + 1], full, got)
        for i in (0, 1)
    ]
    weights = torch.cat([h.weights for h in halves])
    keep = torch.cat([h.keep for h in halves]) != 0
    if config["rollout_is"] == "sequence":
        per_row = weights.amax(dim=-1)
        assert float(per_row.mean()) == pytest.approx(1.0, rel=1e-12)
    else:
        assert float(weights[keep].mean()) == pytest.approx(1.0, rel=1e-12)
    assert all(float(h.metrics["rollout_is_scale"][0]) == pytest.approx(got) for h in halves)


@pytest.mark.parametrize("loss", LOSSES)
def test_a_batch_normalised_loss_is_the_weighted_loss_times_the_scale(loss):
    fn = loss()
    plain = fn.configure({"rollout_correction": "token_tis"})
    normal = fn.configure({"rollout_correction": "token_tis", "rollout_is_batch_normalize": True})
    assert "old_log_probs" in fn.required_fields(normal)
    assert "old_log_probs" not in fn.required_fields(plain)
    assert fn.weight_scale(plain, lambda: {}) is None
    current, batch = _batch()
    scale = fn.weight_scale(normal, lambda: batch)
    assert scale == pytest.approx(5 / 7)
    base = fn(current, batch, **plain)
    scaled = fn(current, {**batch, "rollout_is_scale": scale}, **normal)
    pg_base, pg_scaled = base.metrics["pg_loss"], scaled.metrics["pg_loss"]
    assert float(pg_scaled[0]) == pytest.approx(scale * float(pg_base[0]), rel=1e-9)
