"""Rollout correction: weights and rejection for the gap between the trainer and the sampler.

The sampler (policy ``mu``) drew the tokens and gave their ``rollout_log_probs``; the trainer's
policy ``pi`` is the old one (``old_log_probs``, else the current one, detached) or, in bypass
mode, the current one. Per trained token ``delta = log pi - log mu`` (clamped to +-20) and
``rho = exp(delta)``. The loss multiplies its policy-gradient term by the importance weights and
drops rejected tokens from every term; both are constants in the gradient.

Keys of ``loss_config`` (every policy-gradient loss takes them):

- ``rollout_correction``: a preset name (``PRESETS``); the keys it sets are defaults that keys
  given beside it override.
- ``rollout_is``: ``None`` (no weights), ``"token"`` (``w_t = rho_t``) or ``"sequence"`` (``w =
  prod_t rho_t`` on every token of the row).
- ``rollout_is_mode``: ``"truncate"`` (``w`` clamped to ``[floor, cap]``) or ``"mask"`` (``w`` set
  to 0 outside ``[floor, cap]``: IcePop's band at token level, TRL's sequence mask at sequence
  level; a zeroed token stays in the normaliser).
- ``rollout_is_cap`` (> 0, default 2.0) and ``rollout_is_floor`` (>= 0, below the cap, default 0).
- ``rollout_rs``: rejection rules ``{stat: bound}``; a token or row failing any rule leaves the
  loss and its normaliser. Ratio stats take ``[low, high]`` (``None`` for no bound; a bare
  number ``u`` means ``[1/u, u]``): ``token_ratio`` (``rho_t``), ``seq_ratio`` (``prod rho``),
  ``geo_ratio`` (the geometric mean of ``rho`` over the row) and ``seq_token_ratio`` (a row is
  dropped if any of its tokens' ``rho_t`` is outside). Divergence stats take an upper bound:
  ``token_k2``/``token_k3`` per token, ``seq_{mean,sum,max}_k{2,3}`` per row, with ``k2 =
  delta^2 / 2`` and ``k3 = rho - 1 - delta``.
- ``rollout_is_batch_normalize``: the weights divided by their mean over the whole batch (its
  kept tokens at token level, its rows at sequence level, across micro-batches and ranks), so
  they correct the direction without changing the gradient's scale; needs ``old_log_probs``
  (the weights must be known before the pass) and ``rollout_is``.
- ``rollout_bypass``: the rollout log-probs serve as the old ones (the loss's ratio is then
  ``pi / mu``); the rejection compares the current policy with the sampler, and ``rollout_is``
  is refused (the ratio already carries the weight).

Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.errors import LossConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_LOG_RATIO = 20.0
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
RATIO_STATS = ("token_ratio", "seq_ratio", "geo_ratio", "seq_token_ratio")
DIVERGENCE_STATS = (
    "token_k2",
    "token_k3",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_max_k2",
    "seq_max_k3",
)
RS_STATS = RATIO_STATS + DIVERGENCE_STATS

CORRECTION_DEFAULTS: dict[str, Any] = {
    "rollout_correction": None,
    "rollout_is": None,
    "rollout_is_mode": "truncate",
    "rollout_is_cap": 2.0,
    "rollout_is_floor": 0.0,
    "rollout_rs": None,
    "rollout_is_batch_normalize": False,
    "rollout_bypass": False,
}
"""The correction keys every policy-gradient loss accepts, with their defaults (no correction)."""

PRESETS: dict[str, dict[str, Any]] = {
    "token_tis": {"rollout_is": "token", "rollout_is_cap": 2.0},
    "seq_tis": {"rollout_is": "sequence", "rollout_is_cap": 2.0},
    "icepop": {
        "rollout_is": "token",
        "rollout_is_mode": "mask",
        "rollout_is_floor": 0.5,
        "rollout_is_cap": 5.0,
    },
    "seq_mask": {"rollout_is": "sequence", "rollout_is_mode": "mask", "rollout_is_cap": 3.0},
    "geo_rs": {"rollout_rs": {"geo_ratio": [0.999, 1.001]}},
    "seq_tis_rs": {
        "rollout_is": "sequence",
        "rollout_is_cap": 2.0,
        "rollout_rs": {"seq_ratio": [0.5, 2.0]},
    },
    "token_tis_veto": {
        "rollout_is": "token",
        "rollout_is_floor": 0.5,
        "rollout_is_cap": 2.0,
        "rollout_rs": {"seq_token_ratio": [1e-4, None]},
    },
    "bypass": {"rollout_bypass": True},
    "bypass_k3_rs": {"rollout_bypass": True, "rollout_rs": {"seq_mean_k3": 0.01}},
}
"""Named combinations: token/sequence truncated IS at 2 (verl, slime), IcePop's [0.5, 5] band,
TRL's default sequence mask at 3, verl's geometric-mean rejection and sequence IS with a ratio
band, slime's MIS example (token IS in [0.5, 2] with a 1e-4 veto), and bypass (with verl's
k3 rejection)."""

IS_METRICS = ("rollout_is_weight", "rollout_is_weight_sq", "rollout_is_clipped")
RS_METRICS = ("rollout_rs_masked", "rollout_rs_seq_masked")


def expand_preset(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with its ``rollout_correction`` preset's keys filled in where not given."""
    name = given.get("rollout_correction")
    if name is None:
        return dict(given)
    if not isinstance(name, str) or name not in PRESETS:
        raise LossConfigError(
            f"loss_config rollout_correction={name!r} is not one of {sorted(PRESETS)}"
        )
    return {**PRESETS[name], **given}


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LossConfigError(f"loss_config {key}={value!r} must be a finite number")
    return float(value)


def _band(stat: str, bound: Any) -> list[float | None]:
    """A ratio rule's ``[low, high]`` (``u`` alone: ``[1/u, u]``), checked."""
    where = f"loss_config rollout_rs[{stat!r}]"
    if isinstance(bound, int | float) and not isinstance(bound, bool):
        u = _number(where, bound)
        if u < 1.0:
            raise LossConfigError(f"{where}={bound!r}: a single bound u means [1/u, u], so u >= 1")
        return [1.0 / u, u]
    if not isinstance(bound, list | tuple) or len(bound) != 2:
        raise LossConfigError(f"{where}={bound!r} must be [low, high] (None: no bound) or u >= 1")
    low, high = (None if b is None else _number(where, b) for b in bound)
    if low is not None and low < 0:
        raise LossConfigError(f"{where}: low bound {low} must be >= 0")
    if high is not None and high <= 0:
        raise LossConfigError(f"{where}: high bound {high} must be > 0")
    if low is not None and high is not None and low > high:
        raise LossConfigError(f"{where}: low bound {low} exceeds high bound {high}")
    return [low, high]


def check_correction(config: dict[str, Any]) -> None:
    """Check (and normalise in place) the correction keys of a merged ``config``."""
    level = config.get("rollout_is")
    if level is not None and level not in IS_LEVELS:
        raise LossConfigError(
            f"loss_config rollout_is={level!r} is not one of {[None, *IS_LEVELS]}"
        )
    mode = config.get("rollout_is_mode", "truncate")
    if mode not in IS_MODES:
        raise LossConfigError(
            f"loss_config rollout_is_mode={mode!r} is not one of {list(IS_MODES)}"
        )
    cap = _number("rollout_is_cap", config.get("rollout_is_cap", 2.0))
    floor = _number("rollout_is_floor", config.get("rollout_is_floor", 0.0))
    if cap <= 0:
        raise LossConfigError(f"loss_config rollout_is_cap={cap} must be > 0")
    if floor < 0 or floor >= cap:
        raise LossConfigError(
            f"loss_config rollout_is_floor={floor} must be >= 0 and below rollout_is_cap={cap}"
        )
    bypass = config.get("rollout_bypass", False)
    if not isinstance(bypass, bool):
        raise LossConfigError(f"loss_config rollout_bypass={bypass!r} must be true or false")
    if bypass and level is not None:
        raise LossConfigError(
            f"loss_config rollout_is={level!r} makes no sense with rollout_bypass=true: the "
            "loss's ratio is already pi/mu; use the loss's clipping, or rollout_rs"
        )
    normalize = config.get("rollout_is_batch_normalize", False)
    if not isinstance(normalize, bool):
        raise LossConfigError(
            f"loss_config rollout_is_batch_normalize={normalize!r} must be true or false"
        )
    if normalize and level is None:
        raise LossConfigError(
            "loss_config rollout_is_batch_normalize=true needs importance weights: set "
            f"rollout_is to one of {list(IS_LEVELS)}"
        )
    rules = config.get("rollout_rs")
    if rules is not None:
        if not isinstance(rules, Mapping) or not rules:
            raise LossConfigError(
                f"loss_config rollout_rs={rules!r} must be a non-empty mapping of rules "
                f"{{stat: bound}}, stats {list(RS_STATS)}"
            )
        normal: dict[str, Any] = {}
        for stat, bound in rules.items():
            if stat in RATIO_STATS:
                normal[stat] = _band(stat, bound)
            elif stat in DIVERGENCE_STATS:
                u = _number(f"rollout_rs[{stat!r}]", bound)
                if u <= 0:
                    raise LossConfigError(f"loss_config rollout_rs[{stat!r}]={u} must be > 0")
                normal[stat] = u
            else:
                raise LossConfigError(
                    f"loss_config rollout_rs has unknown stat {stat!r}; allowed: {list(RS_STATS)}"
                )
        config["rollout_rs"] = normal
    config["rollout_is_cap"], config["rollout_is_floor"] = cap, floor


def is_active(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` asks for any correction (and so needs ``rollout_log_probs``)."""
    return bool(
        config.get("rollout_is") or config.get("rollout_rs") or config.get("rollout_bypass")
    )


@dataclass
class Correction:
    """What a correction gives one micro-batch: per-token weights and the kept-token mask
    (both ``[B, T]``, no gradient) and its ``(sum, count)`` metrics and ``(min, max)`` extrema."""

    weights: torch.Tensor
    keep: torch.Tensor
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    extrema: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _in_band(log_value: torch.Tensor, band: list[float | None]) -> torch.Tensor:
    """Where ``exp(log_value)`` lies in ``[low, high]``, compared in log space."""
    import torch

    low, high = band
    ok = torch.ones_like(log_value, dtype=torch.bool)
    if low is not None and low > 0:
        ok &= log_value >= math.log(low)
    if high is not None:
        ok &= log_value <= math.log(high)
    return ok


def rejection(
    delta: torch.Tensor, selected: torch.Tensor, rules: Mapping[str, Any]
) -> torch.Tensor:
    """The kept tokens ``[B, T]`` (bool) under ``rules``: a token is dropped if a token rule
    fails on it or a row rule fails on its row. ``delta`` is 0 outside ``selected``."""
    import torch

    keep_token = selected.clone()
    keep_row = torch.ones(delta.shape[0], dtype=torch.bool, device=delta.device)
    length = selected.sum(dim=-1).clamp(min=1).to(delta.dtype)
    zero = torch.zeros_like(delta)
    k2 = torch.where(selected, 0.5 * delta * delta, zero)
    k3 = torch.where(selected, torch.expm1(delta) - delta, zero)
    for stat, bound in rules.items():
        if stat == "token_ratio":
            keep_token &= _in_band(delta, bound)
        elif stat == "seq_ratio":
            keep_row &= _in_band(delta.sum(dim=-1), bound)
        elif stat == "geo_ratio":
            keep_row &= _in_band(delta.sum(dim=-1) / length, bound)
        elif stat == "seq_token_ratio":
            keep_row &= (_in_band(delta, bound) | ~selected).all(dim=-1)
        else:
            value = k2 if stat.endswith("k2") else k3
            if stat.startswith("token_"):
                keep_token &= value <= bound
            elif stat.startswith("seq_sum_"):
                keep_row &= value.sum(dim=-1) <= bound
            elif stat.startswith("seq_mean_"):
                keep_row &= value.sum(dim=-1) / length <= bound
            else:  # seq_max_
                keep_row &= value.amax(dim=-1) <= bound
    return keep_token & keep_row.unsqueeze(-1)


def log_ratio(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, selected: torch.Tensor
) -> torch.Tensor:
    """``delta = train - rollout`` in float64 over ``selected`` (0 elsewhere), clamped to +-20."""
    import torch

    train = train_log_probs.detach().to(torch.float64)
    rollout = rollout_log_probs.detach().to(torch.float64)
    delta = torch.where(selected, train - rollout, torch.zeros_like(train))
    return delta.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def kept_tokens(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: Mapping[str, Any],
) -> torch.Tensor:
    """``loss_mask`` with the rejected tokens set to 0 (``loss_mask`` itself without rules)."""
    rules = config.get("rollout_rs")
    if not rules:
        return loss_mask
    selected = loss_mask != 0
    keep = rejection(log_ratio(train_log_probs, rollout_log_probs, selected), selected, rules)
    return loss_mask * keep.to(loss_mask.dtype)


def batch_weight_scale(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: Mapping[str, Any],
) -> float:
    """``1 / mean(w)`` of the whole batch's importance weights (kept tokens at token level,
    rows with a kept token at sequence level), for ``rollout_is_batch_normalize``; 1.0 when
    nothing is kept."""
    import torch

    corr = correct(old_log_probs, rollout_log_probs, loss_mask, config)
    keep = corr.keep != 0
    weights = corr.weights.to(torch.float64)
    if config.get("rollout_is") == "sequence":
        rows = keep.any(dim=-1)
        first = torch.where(keep, weights, torch.zeros_like(weights)).amax(dim=-1)
        total, count = first[rows].sum(), rows.sum()
    else:
        total, count = weights[keep].sum(), keep.sum()
    if int(count) == 0 or float(total) <= 0:
        return 1.0
    return float(count) / float(total)


def correct(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: Mapping[str, Any],
    scale: float | None = None,
) -> Correction:
    """This micro-batch's weights, kept tokens and metrics under ``config`` (see the module);
    ``scale`` multiplies the weights (``batch_weight_scale``: the batch normalisation)."""
    import torch

    selected = loss_mask != 0
    delta = log_ratio(train_log_probs, rollout_log_probs, selected)
    dtype = loss_mask.dtype
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    extrema: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    keep = selected
    rules = config.get("rollout_rs")
    if rules:
        keep = rejection(delta, selected, rules)
        dropped = (selected & ~keep).to(torch.float64)
        metrics["rollout_rs_masked"] = (dropped.sum(), selected.to(torch.float64).sum())
        has = selected.any(dim=-1)
        row_dropped = has & ~keep.any(dim=-1)
        metrics["rollout_rs_seq_masked"] = (
            row_dropped.to(torch.float64).sum(),
            has.to(torch.float64).sum(),
        )
    weights = torch.ones_like(delta)
    level = config.get("rollout_is")
    if level is not None:
        cap, floor = float(config["rollout_is_cap"]), float(config["rollout_is_floor"])
        log_w = delta if level == "token" else delta.sum(dim=-1, keepdim=True).expand_as(delta)
        raw = torch.exp(log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
        inside = (raw >= floor) & (raw <= cap)
        if config.get("rollout_is_mode", "truncate") == "mask":
            weights = torch.where(inside, raw, torch.zeros_like(raw))
        else:
            weights = raw.clamp(floor, cap)
        if scale is not None:
            weights = weights * scale
            metrics["rollout_is_scale"] = (
                torch.tensor(scale, dtype=torch.float64),
                torch.tensor(1.0, dtype=torch.float64),
            )
        kept = keep.to(torch.float64)
        count = kept.sum()
        metrics["rollout_is_weight"] = ((weights * kept).sum(), count)
        metrics["rollout_is_weight_sq"] = ((weights * weights * kept).sum(), count)
        metrics["rollout_is_clipped"] = ((~inside).to(torch.float64).mul(kept).sum(), count)
        extrema["rollout_is_weight"] = masked_extrema(weights, keep)
    weights = torch.where(keep, weights, torch.zeros_like(weights))
    return Correction(
        weights=weights.to(dtype), keep=keep.to(dtype), metrics=metrics, extrema=extrema
    )


def masked_extrema(values: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min, max)`` of ``values`` over ``where`` (``+inf``/``-inf`` when empty)."""
    import torch

    inf = torch.full_like(values, math.inf)
    return torch.where(where, values, inf).min(), torch.where(where, values, -inf).max()


def effective_sample_size(metrics: Mapping[str, float]) -> float | None:
    """ESS of the applied weights, ``mean(w)^2 / mean(w^2)`` in (0, 1], from reduced metrics."""
    mean, mean_sq = metrics.get("rollout_is_weight"), metrics.get("rollout_is_weight_sq")
    if mean is None or mean_sq is None or not mean_sq:
        return None
    return float(mean) ** 2 / float(mean_sq)
