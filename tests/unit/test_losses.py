"""The built-in losses against values worked out by hand on two tiny sequences."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from arctic_platform.rl.errors import LossConfigError  # noqa: E402
from arctic_platform.rl.losses import (  # noqa: E402
    aggregate,
    kl_penalty,
    make_cispo,
    make_cross_entropy,
    make_dro,
    make_grpo,
    make_importance_sampling,
    make_ppo,
    token_metric,
)
from arctic_platform.rl.plugins import get_registry  # noqa: E402

# Two rows of 3 positions; column 0 is never trained. Row 0 trains positions 1 and 2,
# row 1 trains position 2 only.
LOG_PROBS = [[0.0, math.log(0.5), math.log(0.25)], [0.0, math.log(0.8), math.log(0.1)]]
OLD = [[0.0, math.log(0.4), math.log(0.25)], [0.0, math.log(0.8), math.log(0.2)]]
MASK = [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]


def batch(**extra: object) -> dict[str, object]:
    """The tiny batch as tensors, with global counts for one micro-batch."""
    out: dict[str, object] = {
        "loss_mask": torch.tensor(MASK, dtype=torch.float64),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "old_log_probs": torch.tensor(OLD, dtype=torch.float64),
        "num_tokens": 3.0,
        "num_seqs": 2.0,
    }
    out.update(extra)
    return out


def log_probs() -> torch.Tensor:
    return torch.tensor(LOG_PROBS, dtype=torch.float64, requires_grad=True)


def run(loss: object, config: dict | None = None, **extra: object):
    cfg = loss.configure(config)  # type: ignore[attr-defined]
    return loss(log_probs(), batch(**extra), **cfg)  # type: ignore[operator]


def test_ppo_token_mean_clips_the_ratio_on_each_side() -> None:
    # Ratios on trained tokens: 0.5/0.4 = 1.25 (A=1, clipped to 1.2), 1.0 (A=1), 0.5 (A=-2,
    # clipped to 0.8). Per-token loss = max(-A r, -A clip(r)): max(-1.25, -1.2) = -1.2;
    # max(-1, -1) = -1; max(1.0, 1.6) = 1.6. Token mean = (-1.2 - 1 + 1.6) / 3.
    out = run(make_ppo())
    assert out.loss.item() == pytest.approx((-1.2 - 1.0 + 1.6) / 3)
    s, n = out.metrics["clip_frac"]
    assert (s.item(), n.item()) == (2.0, 3.0)
    s, n = out.metrics["ratio"]
    assert s.item() == pytest.approx(1.25 + 1.0 + 0.5)


def test_ppo_dual_clip_caps_negative_advantage_tokens() -> None:
    # With clip_ratio_c=3 the A=-2 token's loss is capped at -A*c = 6. An old log-prob of
    # ln 0.025 makes r = 4: max(-A r, -A clip(r)) = max(8, 2.4) = 8 -> capped to 6.
    old = torch.tensor(
        [[0.0, math.log(0.4), math.log(0.25)], [0.0, 0.0, math.log(0.025)]], dtype=torch.float64
    )
    loss = make_ppo()
    cfg = loss.configure({"clip_ratio_c": 3.0})
    out = loss(log_probs(), batch(old_log_probs=old), **cfg)
    assert out.loss.item() == pytest.approx((-1.2 - 1.0 + 6.0) / 3)
    s, _ = out.metrics["dual_clip_frac"]
    assert s.item() == 1.0


def test_grpo_defaults_to_mean_over_sequences_of_token_means() -> None:
    # Same per-token losses as PPO: row 0 mean (-1.2 - 1) / 2 = -1.1, row 1: 1.6.
    out = run(make_grpo())
    assert out.loss.item() == pytest.approx((-1.1 + 1.6) / 2)
    s, n = out.metrics["loss"]
    assert (s.item(), n.item()) == (pytest.approx(0.5), 2.0)


def test_grpo_seq_mean_token_sum() -> None:
    out = run(make_grpo(), {"aggregation": "seq-mean-token-sum"})
    assert out.loss.item() == pytest.approx((-2.2 + 1.6) / 2)


def test_grpo_k3_kl_to_the_reference_is_added_with_its_coefficient() -> None:
    # ref = old; k3 = exp(ref - logp) - (ref - logp) - 1 per trained token:
    # r' = 0.8 -> 0.8 - ln 0.8 - 1; r' = 1 -> 0; r' = 2 -> 2 - ln 2 - 1.
    k = [0.8 - math.log(0.8) - 1, 0.0, 2 - math.log(2) - 1]
    ref = torch.tensor(OLD, dtype=torch.float64)
    out = run(make_grpo(), {"kl_coef": 0.5}, ref_log_probs=ref)
    rows = [((-1.2 + 0.5 * k[0]) + (-1.0 + 0.5 * k[1])) / 2, 1.6 + 0.5 * k[2]]
    assert out.loss.item() == pytest.approx(sum(rows) / 2)
    s, n = out.metrics["kl"]
    assert s.item() == pytest.approx(sum(k)) and n.item() == 3.0


def test_ppo_k1_kl_and_entropy_bonus() -> None:
    ref = torch.zeros(2, 3, dtype=torch.float64)
    entropy = torch.tensor([[9.0, 1.0, 2.0], [9.0, 9.0, 3.0]], dtype=torch.float64)
    cfg_loss = make_ppo()
    cfg = cfg_loss.configure({"kl_coef": 0.1, "entropy_coef": 0.01})
    out = cfg_loss(log_probs(), batch(ref_log_probs=ref, entropy=entropy), **cfg)
    k1 = math.log(0.5) + math.log(0.25) + math.log(0.1)
    expected = (-1.2 - 1.0 + 1.6 + 0.1 * k1 - 0.01 * (1.0 + 2.0 + 3.0)) / 3
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["entropy"][0].item() == pytest.approx(6.0)


def test_importance_sampling_is_unclipped() -> None:
    # -A r: -1.25, -1.0, +1.0 -> mean -1.25 / 3.
    out = run(make_importance_sampling())
    assert out.loss.item() == pytest.approx((-1.25 - 1.0 + 1.0) / 3)


def test_cross_entropy_is_the_mean_negative_log_likelihood_of_trained_tokens() -> None:
    out = run(make_cross_entropy())
    expected = -(math.log(0.5) + math.log(0.25) + math.log(0.1)) / 3
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["nll"][0].item() == pytest.approx(expected * 3)


def test_cross_entropy_gradient_is_minus_mask_over_tokens() -> None:
    lp = log_probs()
    loss = make_cross_entropy()
    loss(lp, batch(), **loss.configure(None)).loss.backward()
    assert lp.grad.tolist() == [[0.0, -1 / 3, -1 / 3], [0.0, 0.0, -1 / 3]]


def test_on_policy_ratio_defaults_to_one_without_old_log_probs() -> None:
    b = batch()
    del b["old_log_probs"]
    loss = make_ppo()
    out = loss(log_probs(), b, **loss.configure(None))
    # r = 1 everywhere: -A -> (-1 - 1 + 2) / 3 = 0.
    assert out.loss.item() == pytest.approx(0.0)


def test_shares_of_micro_batches_add_up_to_the_global_mean() -> None:
    loss = make_grpo()
    cfg = loss.configure(None)
    whole = loss(log_probs(), batch(), **cfg).loss.item()
    parts = 0.0
    for row in (0, 1):
        b = {k: (v[row : row + 1] if torch.is_tensor(v) else v) for k, v in batch().items()}
        parts += loss(log_probs()[row : row + 1], b, **cfg).loss.item()
    assert parts == pytest.approx(whole)


def test_padding_with_huge_values_stays_finite() -> None:
    lp = torch.tensor([[0.0, -200.0]], dtype=torch.float64, requires_grad=True)
    b = {
        "loss_mask": torch.tensor([[0.0, 0.0]], dtype=torch.float64),
        "advantages": torch.tensor([[1.0, 1.0]], dtype=torch.float64),
        "old_log_probs": torch.tensor([[0.0, 0.0]], dtype=torch.float64),
        "ref_log_probs": torch.tensor([[0.0, 0.0]], dtype=torch.float64),
        "num_tokens": 1.0,
        "num_seqs": 1.0,
    }
    loss = make_grpo()
    out = loss(lp, b, **loss.configure({"kl_coef": 1.0}))
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.isfinite(lp.grad).all()


def test_unknown_loss_config_key_lists_the_allowed_ones() -> None:
    with pytest.raises(
        LossConfigError,
        match=r"unknown loss_config key\(s\) \['clip'\].*"
        r"allowed: \[.*'clip_eps_high'.*\]",
    ):
        make_ppo().configure({"clip": 0.1})


@pytest.mark.parametrize(
    "config",
    [
        {"aggregation": "mean"},
        {"kl_estimator": "k9"},
        {"clip_ratio_c": 0.5},
        {"clip_eps_low": -0.1},
        {"kl_coef": float("nan")},
    ],
)
def test_bad_loss_config_values_are_refused(config: dict) -> None:
    with pytest.raises(LossConfigError):
        make_grpo().configure(config)


def test_eps_clip_alias_sets_both_sides() -> None:
    cfg = make_ppo().configure({"eps_clip": 0.1})
    assert cfg["clip_eps_low"] == cfg["clip_eps_high"] == 0.1


def test_kl_needs_reference_log_probs() -> None:
    loss = make_ppo()
    assert "ref_log_probs" in loss.required_fields(loss.configure({"kl_coef": 0.1}))
    assert "ref_log_probs" not in loss.required_fields(loss.configure(None))


def test_aggregate_seq_modes_skip_rows_without_trained_tokens() -> None:
    values = torch.tensor([[1.0, 2.0], [5.0, 5.0]])
    weights = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    share, total, count = aggregate(values, weights, "seq-mean-token-mean", 2.0, 1.0)
    assert (share.item(), total.item(), count.item()) == (1.5, 1.5, 1.0)


def test_builtin_losses_are_registered_with_real_factories() -> None:
    reg = get_registry()
    for name in ("grpo", "ppo", "importance_sampling", "cispo", "dro", "cross_entropy"):
        spec = reg.get("loss", name)
        assert spec.implemented
        assert callable(spec.create())


# --- exact messages, edges and names (each kills a mutant the tests above let through) ------


def _refusal(loss: object, config: dict) -> str:
    with pytest.raises(LossConfigError) as info:
        loss.configure(config)  # type: ignore[attr-defined]
    return str(info.value)


def test_the_builtin_losses_carry_their_names() -> None:
    assert [make_grpo().name, make_ppo().name] == ["grpo", "ppo"]
    assert make_importance_sampling().name == "importance_sampling"
    assert make_cross_entropy().name == "cross_entropy"


def test_an_unknown_aggregation_or_estimator_is_refused_with_the_choices() -> None:
    assert _refusal(make_grpo(), {"aggregation": "sum"}) == (
        "loss_config aggregation='sum' is not one of "
        "['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean']"
    )
    assert _refusal(make_grpo(), {"kl_estimator": "k9"}) == (
        "loss_config kl_estimator='k9' is not one of ['k1', 'k2', 'k3']"
    )
    values, weights = torch.ones(1, 2), torch.ones(1, 2)
    with pytest.raises(LossConfigError) as info:
        aggregate(values, weights, "sum", 2.0, 1.0)
    assert str(info.value) == (
        "aggregation 'sum' is not one of "
        "['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean']"
    )
    with pytest.raises(LossConfigError) as info:
        kl_penalty(values, values, "k9", weights != 0)
    assert str(info.value) == "kl_estimator 'k9' is not one of ['k1', 'k2', 'k3']"


@pytest.mark.parametrize("key", ["kl_coef", "entropy_coef", "clip_eps_low", "clip_eps_high"])
def test_each_coefficient_must_be_a_finite_number_not_a_bool(key: str) -> None:
    for bad in ("0.1", True, None):
        assert _refusal(make_grpo(), {key: bad}) == f"loss_config {key}={bad!r} must be a number"
    assert _refusal(make_grpo(), {key: math.inf}) == f"loss_config {key}=inf must be finite"


@pytest.mark.parametrize("key", ["clip_eps_low", "clip_eps_high"])
def test_a_clip_epsilon_may_be_zero_but_not_negative(key: str) -> None:
    assert make_ppo().configure({key: 0.0})[key] == 0.0
    assert _refusal(make_ppo(), {key: -0.1}) == f"loss_config {key}=-0.1 must be >= 0"


def test_clip_eps_low_must_stay_below_one() -> None:
    assert make_ppo().configure({"clip_eps_low": 0.99})["clip_eps_low"] == 0.99
    assert _refusal(make_ppo(), {"clip_eps_low": 1.0}) == (
        "loss_config clip_eps_low=1.0 must be < 1 "
        "(the ratio is clipped to [1 - clip_eps_low, 1 + clip_eps_high])"
    )


def test_clip_ratio_c_must_be_a_number_above_one() -> None:
    assert make_ppo().configure({"clip_ratio_c": 1.5})["clip_ratio_c"] == 1.5
    for bad in (1.0, True, "3"):
        assert _refusal(make_ppo(), {"clip_ratio_c": bad}) == (
            f"loss_config clip_ratio_c={bad!r} must be None or a number > 1"
        )


def test_eps_clip_may_repeat_a_side_but_not_contradict_it() -> None:
    cfg = make_ppo().configure({"eps_clip": 0.3, "clip_eps_low": 0.3})
    assert (cfg["clip_eps_low"], cfg["clip_eps_high"]) == (0.3, 0.3)
    assert _refusal(make_ppo(), {"eps_clip": 0.3, "clip_eps_low": 0.1}) == (
        "loss_config eps_clip=0.3 disagrees with clip_eps_low=0.1; "
        "eps_clip sets ['clip_eps_low', 'clip_eps_high']"
    )


def test_required_fields_and_entropy_follow_the_coefficients() -> None:
    grpo = make_grpo()
    assert grpo.required_fields({}) == {"advantages"}
    assert grpo.required_fields({"kl_coef": 0.1}) == {"advantages", "ref_log_probs"}
    assert not grpo.needs_entropy({}) and not grpo.needs_entropy({"entropy_coef": 0.0})
    assert grpo.needs_entropy({"entropy_coef": 0.1})


def test_missing_reference_or_entropy_names_the_loss_and_the_coefficient() -> None:
    loss = make_importance_sampling()
    with pytest.raises(LossConfigError) as info:
        run(loss, {"kl_coef": 0.5})
    assert str(info.value) == (
        "loss 'importance_sampling' has kl_coef=0.5 but the batch has no 'ref_log_probs'"
    )
    with pytest.raises(LossConfigError) as info:
        run(make_grpo(), {"entropy_coef": 0.25})
    assert str(info.value) == "loss 'grpo' has entropy_coef=0.25 but the engine gave no 'entropy'"


def test_k2_is_half_the_squared_log_ratio() -> None:
    lp, ref = torch.tensor([[0.0, -1.0, -3.0]]), torch.tensor([[0.0, -2.0, -0.5]])
    kl = kl_penalty(lp, ref, "k2", torch.tensor([[False, True, True]]))
    assert kl.tolist() == [[0.0, 0.5, 0.5 * 2.5 * 2.5]]


def test_k3_clamps_the_log_ratio_at_twenty_both_ways() -> None:
    lp, ref = torch.tensor([[30.0, -30.0]], dtype=torch.float64), torch.zeros(1, 2).double()
    kl = kl_penalty(lp, ref, "k3", torch.ones(1, 2, dtype=torch.bool))
    assert kl.tolist() == [[math.exp(-20.0) - 1.0 + 20.0, math.exp(20.0) - 1.0 - 20.0]]


@pytest.mark.parametrize("make", [make_ppo, make_importance_sampling])
@pytest.mark.parametrize(("old", "ratio"), [(-25.0, math.exp(20.0)), (25.0, math.exp(-20.0))])
def test_the_ratio_is_clamped_at_exp_twenty_both_ways(make, old, ratio) -> None:
    extra = {
        "old_log_probs": torch.tensor([[0.0, old]], dtype=torch.float64),
        "loss_mask": torch.tensor([[0.0, 1.0]], dtype=torch.float64),
        "advantages": torch.ones(1, 2, dtype=torch.float64),
        "num_tokens": 1.0,
        "num_seqs": 1.0,
    }
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    out = make()(lp, batch(**extra), **make().configure(None))
    s, n = out.metrics["ratio"]
    assert s.item() == pytest.approx(ratio, rel=1e-12) and n.item() == 1.0


@pytest.mark.parametrize("make", [make_grpo, make_ppo, make_importance_sampling])
def test_policy_losses_report_pg_loss_and_ratio(make) -> None:
    out = run(make())
    assert {"pg_loss", "ratio", "loss"} <= set(out.metrics)


def test_importance_sampling_without_old_log_probs_has_ratio_one_and_honours_its_config() -> None:
    b = batch()
    del b["old_log_probs"]
    loss = make_importance_sampling()
    cfg = loss.configure({"aggregation": "seq-mean-token-sum", "kl_coef": 0.5})
    ref = torch.tensor(LOG_PROBS, dtype=torch.float64)
    out = loss(log_probs(), {**b, "ref_log_probs": ref}, **cfg)
    s, n = out.metrics["ratio"]
    assert (s.item(), n.item()) == (3.0, 3.0)
    assert out.metrics["kl"][0].item() == 0.0  # the policy is its own reference here
    # seq-mean-token-sum: (-(1 + 1) + 2) / 2 sequences
    assert out.loss.item() == pytest.approx((-2.0 + 2.0) / 2)


def test_cross_entropy_honours_a_non_default_aggregation() -> None:
    loss = make_cross_entropy()
    out = loss(log_probs(), batch(), **loss.configure({"aggregation": "seq-mean-token-sum"}))
    nll = -(math.log(0.5) + math.log(0.25)) - math.log(0.1)
    assert out.loss.item() == pytest.approx(nll / 2)


def test_dual_clip_leaves_positive_advantages_alone() -> None:
    adv = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], dtype=torch.float64)
    plain = run(make_ppo(), advantages=adv)
    dual = run(make_ppo(), {"clip_ratio_c": 3.0}, advantages=adv)
    assert dual.loss.item() == plain.loss.item()
    assert dual.metrics["dual_clip_frac"][0].item() == 0.0


def test_dual_clip_counts_only_tokens_strictly_past_the_cap() -> None:
    # ratio exactly 2 on one token with A = -1 and c = 2: the loss equals the cap, not past it
    two = torch.tensor([[0.0, math.log(2.0), 0.0]], dtype=torch.float64)
    extra = {
        "old_log_probs": torch.zeros(1, 3, dtype=torch.float64),
        "loss_mask": torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64),
        "advantages": -torch.ones(1, 3, dtype=torch.float64),
        "num_tokens": 1.0,
        "num_seqs": 1.0,
    }
    loss = make_ppo()
    lp = two.clone().requires_grad_(True)
    out = loss(lp, batch(**extra), **loss.configure({"clip_ratio_c": 2.0}))
    assert math.exp(math.log(2.0)) == 2.0
    assert out.metrics["dual_clip_frac"][0].item() == 0.0


def test_counts_are_in_the_dtype_of_the_values() -> None:
    values = torch.ones(2, 3, dtype=torch.float64)
    weights = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    _, _, count = aggregate(values, weights, "seq-mean-token-mean", 2.0, 2.0)
    assert count.dtype == torch.float64 and count.item() == 1.0


def test_a_token_metric_weighs_each_value_by_its_weight() -> None:
    values = torch.tensor([[2.0, 4.0, 8.0]])
    total, count = token_metric(values, torch.tensor([[0.5, 0.25, 0.0]]))
    assert (total.item(), count.item()) == (2.0, 0.75)


def test_token_mean_divides_by_a_fractional_global_weight_sum() -> None:
    # per-token weights in the loss mask: the global "token count" is their sum, here 0.5
    values = torch.tensor([[4.0, 8.0]], dtype=torch.float64)
    weights = torch.tensor([[0.25, 0.25]], dtype=torch.float64)
    share, total, count = aggregate(values, weights, "token-mean", 0.5, 1.0)
    assert (share.item(), total.item(), count.item()) == (6.0, 3.0, 0.5)


# --- cispo and dro: the trained tokens (lp, old, A) are (0.5, 0.4, 1), (0.25, 0.25, 1) and
# (0.1, 0.2, -2) as probabilities, so the ratios r are 1.25, 1 and 0.5 ----------------------

TRAINED = [(0, 1, 0.5, 0.4, 1.0), (0, 2, 0.25, 0.25, 1.0), (1, 2, 0.1, 0.2, -2.0)]


def _grads_at_trained(lp: torch.Tensor) -> list[float]:
    return [float(lp.grad[i, j]) for i, j, *_ in TRAINED]


@pytest.mark.parametrize(("config", "cap"), [(None, 4.0), ({"clip_eps_high": 0.1}, 1.1)])
def test_cispo_weighs_each_log_prob_by_its_clipped_ratio_as_a_constant(config, cap) -> None:
    loss = make_cispo()
    lp = log_probs()
    out = loss(lp, batch(), **loss.configure(config))
    out.loss.backward()
    ratios = [min(p / q, cap) for _, _, p, q, _ in TRAINED]
    terms = [-r * a * math.log(p) for r, (*_, p, _, a) in zip(ratios, TRAINED, strict=True)]
    assert out.loss.item() == pytest.approx(sum(terms) / 3)
    # d/dlp of -sg(r) A lp is -r A: the clipped ratio carries no gradient of its own
    expected = [-r * a / 3 for r, (*_, a) in zip(ratios, TRAINED, strict=True)]
    assert _grads_at_trained(lp) == pytest.approx(expected)
    clipped = sum(1 for _, _, p, q, _ in TRAINED if p / q > cap)
    assert out.metrics["clip_frac"][0].item() == clipped


def test_cispo_may_clip_the_ratio_down_to_zero_but_ppo_may_not() -> None:
    assert make_cispo().configure({"clip_eps_low": 1.0})["clip_eps_low"] == 1.0
    assert "must be <= 1" in _refusal(make_cispo(), {"clip_eps_low": 1.5})
    assert "must be < 1" in _refusal(make_ppo(), {"clip_eps_low": 1.0})


@pytest.mark.parametrize("beta", [0.05, 0.0, 2.0])
def test_dro_is_the_policy_gradient_plus_a_quadratic_pull_to_the_old_policy(beta) -> None:
    loss = make_dro()
    lp = log_probs()
    out = loss(lp, batch(), **loss.configure({"beta": beta}))
    out.loss.backward()
    d = [math.log(p) - math.log(q) for _, _, p, q, _ in TRAINED]
    terms = [
        -a * math.log(p) + beta / 2 * x * x for x, (*_, p, _, a) in zip(d, TRAINED, strict=True)
    ]
    assert out.loss.item() == pytest.approx(sum(terms) / 3)
    expected = [(-a + beta * x) / 3 for x, (*_, a) in zip(d, TRAINED, strict=True)]
    assert _grads_at_trained(lp) == pytest.approx(expected)


@pytest.mark.parametrize("beta", [-0.1, float("nan"), "0.1", True])
def test_dro_refuses_a_beta_that_is_not_a_finite_number_at_least_zero(beta) -> None:
    assert "beta" in _refusal(make_dro(), {"beta": beta})
