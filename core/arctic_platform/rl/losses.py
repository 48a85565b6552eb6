"""Built-in losses for ``fwd_bwd`` (grpo, ppo, importance_sampling, cispo, dro,
cross_entropy).

The ``LossFn`` contract, for these and for third-party losses: an engine calls the loss once
per micro-batch as ``loss_fn(log_probs, batch, **config)``.

- ``log_probs``: float tensor ``[B, T]`` with grad, entry ``i`` = ``log p(x_i | x_<i)``; 0 in
  column 0 and on right padding.
- ``batch``: tensors ``[B, T]`` ``input_ids``, ``loss_mask`` (0 on padding), ``advantages``,
  and when given ``old_log_probs`` (the policy the update is measured against),
  ``ref_log_probs`` and ``rollout_log_probs`` (the sampler's own, as it sampled);
  ``entropy`` when the loss asks for it;
  plus the floats ``num_tokens`` and ``num_seqs``: the loss-mask sum and the number of rows
  with a trained token in the WHOLE batch, over every micro-batch and rank.
- It returns a ``LossOutput``: ``loss`` is this micro-batch's share of the global mean (so the
  shares of all micro-batches and ranks add up to it exactly), ``metrics`` maps names to
  ``(sum, count)`` pairs that the engine adds up and reports as ``{name}.sum``/``{name}.tokens``
  (and their ratio as ``{name}``), and ``extrema`` maps names to ``(min, max)`` pairs that the
  engine reduces to ``{name}.min``/``{name}.max``.
  A loss may instead return a per-token tensor ``[B, T]``; the engine then token-means it.

Built-in losses also offer ``configure(loss_config)`` (defaults merged; unknown keys are a
``LossConfigError``), ``required_fields(config)``, ``needs_entropy(config)`` and
``normalisers(config, whole_batch)`` (the global token and row counts when a rollout
correction's rejection changes them and the batch alone decides it; the engine then passes
those as ``num_tokens``/``num_seqs``) and ``weight_scale(config, whole_batch)`` (the batch
normalisation of the importance weights, passed to each micro-batch as ``rollout_is_scale``).
The policy-gradient losses take the rollout-correction keys of ``rollout_correction``.
Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.errors import LossConfigError
from arctic_platform.rl.loss_metrics import (
    mismatch_extrema,
    mismatch_metrics,
    token_metric,
)
from arctic_platform.rl.plugins.hookspecs import hookimpl
from arctic_platform.rl.plugins.specs import LossSpec
from arctic_platform.rl.rollout_correction import (
    CORRECTION_DEFAULTS,
    MAX_LOG_RATIO,
    batch_weight_scale,
    check_correction,
    correct,
    expand_preset,
    is_active,
    kept_tokens,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

BUILTIN_LOSSES = ("grpo", "ppo", "importance_sampling", "cispo", "dro", "cross_entropy")
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
POLICY_GRADIENT_LOSSES = ("grpo", "ppo", "importance_sampling", "cispo", "dro")


@dataclass
class LossOutput:
    """One micro-batch's loss (its share of the global mean) and its ``(sum, count)`` metrics."""

    loss: torch.Tensor
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    extrema: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def aggregate(
    values: torch.Tensor,
    weights: torch.Tensor,
    mode: str,
    num_tokens: float,
    num_seqs: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reduce per-token ``values`` [B, T] under ``weights`` (the loss mask) by ``mode``.

    Returns ``(share, sum, count)``: ``share`` is normalised by the GLOBAL ``num_tokens``
    (token-mean) or ``num_seqs`` (seq-mean modes); ``sum``/``count`` are this micro-batch's.
    """
    import torch

    selected = weights != 0
    masked = torch.where(selected, values * weights, torch.zeros_like(values))
    if mode == "token-mean":
        total = masked.sum()
        return total / max(float(num_tokens), 1e-12), total, weights.sum()
    if mode not in ("seq-mean-token-sum", "seq-mean-token-mean"):
        raise LossConfigError(f"aggregation {mode!r} is not one of {list(AGGREGATIONS)}")
    per_seq = masked.sum(dim=-1)
    row_weight = weights.sum(dim=-1)
    has_tokens = selected.any(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / torch.where(has_tokens, row_weight, torch.ones_like(row_weight))
    total = per_seq.sum()
    count = has_tokens.to(values.dtype).sum()
    return total / max(float(num_seqs), 1e-12), total, count


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str, selected: torch.Tensor
) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate by ``estimator`` (k1, k2 or k3).

    With ``r = pi/pi_ref``: k1 = log r, k2 = (log r)^2 / 2, k3 = 1/r - 1 + log r (unbiased and
    non-negative).
    Positions outside ``selected`` give 0 (and a finite gradient).
    """
    import torch

    diff = torch.where(selected, log_probs - ref_log_probs, torch.zeros_like(log_probs))
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff * diff
    if estimator == "k3":
        neg = (-diff).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return torch.exp(neg) - 1.0 - neg
    raise LossConfigError(f"kl_estimator {estimator!r} is not one of {list(KL_ESTIMATORS)}")


class BuiltinLoss:
    """Shared machinery of the built-in losses: defaults, key checks, KL and entropy terms."""

    name = "loss"
    defaults: dict[str, Any] = {}
    aliases: dict[str, tuple[str, ...]] = {}
    lower_clip_may_reach_zero = False

    def configure(self, loss_config: Mapping[str, Any] | None) -> dict[str, Any]:
        """``defaults`` overlaid with ``loss_config``; unknown keys or bad values raise."""
        given = dict(loss_config or {})
        allowed = sorted(set(self.defaults) | set(self.aliases))
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            raise LossConfigError(
                f"unknown loss_config key(s) {unknown} for loss {self.name!r}; allowed: {allowed}"
            )
        if "rollout_correction" in self.defaults:
            given = expand_preset(given)
        config = dict(self.defaults)
        for alias, targets in self.aliases.items():
            if alias in given:
                value = given.pop(alias)
                for target in targets:
                    if target in given and given[target] != value:
                        raise LossConfigError(
                            f"loss_config {alias}={value!r} disagrees with "
                            f"{target}={given[target]!r}; {alias} sets {list(targets)}"
                        )
                    config[target] = value
        config.update(given)
        self._check(config)
        return config

    def _check(self, config: dict[str, Any]) -> None:
        if config.get("aggregation", "token-mean") not in AGGREGATIONS:
            raise LossConfigError(
                f"loss_config aggregation={config['aggregation']!r} is not one of "
                f"{list(AGGREGATIONS)}"
            )
        if "kl_estimator" in config and config["kl_estimator"] not in KL_ESTIMATORS:
            raise LossConfigError(
                f"loss_config kl_estimator={config['kl_estimator']!r} is not one of "
                f"{list(KL_ESTIMATORS)}"
            )
        for key in ("kl_coef", "entropy_coef", "clip_eps_low", "clip_eps_high"):
            if key in config:
                value = config[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise LossConfigError(f"loss_config {key}={value!r} must be a number")
                if not math.isfinite(value):
                    raise LossConfigError(f"loss_config {key}={value!r} must be finite")
        for key in ("clip_eps_low", "clip_eps_high"):
            if key in config and config[key] < 0:
                raise LossConfigError(f"loss_config {key}={config[key]} must be >= 0")
        low = config.get("clip_eps_low", 0.0)
        if low > 1.0 or (low == 1.0 and not self.lower_clip_may_reach_zero):
            bound = "<= 1" if self.lower_clip_may_reach_zero else "< 1"
            raise LossConfigError(
                f"loss_config clip_eps_low={config['clip_eps_low']} must be {bound} "
                "(the ratio is clipped to [1 - clip_eps_low, 1 + clip_eps_high])"
            )
        c = config.get("clip_ratio_c")
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or not c > 1.0):
            raise LossConfigError(f"loss_config clip_ratio_c={c!r} must be None or a number > 1")
        if "rollout_correction" in config:
            check_correction(config)

    def required_fields(self, config: Mapping[str, Any]) -> set[str]:
        """Batch fields this loss needs with ``config``."""
        needed = {"advantages"}
        if config.get("kl_coef", 0.0):
            needed.add("ref_log_probs")
        if is_active(config):
            needed.add("rollout_log_probs")
        if config.get("rollout_is_batch_normalize"):
            needed.add("old_log_probs")  # the weights must be known before the pass
        return needed

    def needs_entropy(self, config: Mapping[str, Any]) -> bool:
        """Whether the engine must provide per-token ``entropy`` in the batch."""
        return bool(config.get("entropy_coef", 0.0))

    def _regularise(
        self,
        per_token: torch.Tensor,
        log_probs: torch.Tensor,
        batch: Mapping[str, Any],
        config: Mapping[str, Any],
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        weights = batch["loss_mask"]
        kl_coef = float(config.get("kl_coef", 0.0))
        if kl_coef:
            if batch.get("ref_log_probs") is None:
                raise LossConfigError(
                    f"loss {self.name!r} has kl_coef={kl_coef} but the batch has no 'ref_log_probs'"
                )
            kl = kl_penalty(log_probs, batch["ref_log_probs"], config["kl_estimator"], weights != 0)
            per_token = per_token + kl_coef * kl
            metrics["kl"] = token_metric(kl, weights)
        entropy_coef = float(config.get("entropy_coef", 0.0))
        if entropy_coef:
            entropy = batch.get("entropy")
            if entropy is None:
                raise LossConfigError(
                    f"loss {self.name!r} has entropy_coef={entropy_coef} but the engine gave "
                    "no 'entropy'"
                )
            per_token = per_token - entropy_coef * entropy
            metrics["entropy"] = token_metric(entropy, weights)
        return per_token

    def _finish(
        self,
        per_token: torch.Tensor,
        primary: str,
        batch: Mapping[str, Any],
        config: Mapping[str, Any],
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]],
        extrema: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> LossOutput:
        weights = batch["loss_mask"]
        mode = config.get("aggregation", "token-mean")
        num_tokens, num_seqs = float(batch["num_tokens"]), float(batch["num_seqs"])
        raw = metrics.pop("_primary_values")[0]
        _, p_sum, p_count = aggregate(raw.detach(), weights, mode, num_tokens, num_seqs)
        metrics[primary] = (p_sum, p_count)
        share, total, count = aggregate(per_token, weights, mode, num_tokens, num_seqs)
        metrics["loss"] = (total.detach(), count)
        return LossOutput(loss=share, metrics=metrics, extrema=extrema or {})

    def __call__(self, log_probs: torch.Tensor, batch: Mapping[str, Any], **config: Any) -> Any:
        raise NotImplementedError  # pragma: no cover


@dataclass
class RolloutSide:
    """A policy-gradient micro-batch as the loss trains it: the batch (rejected tokens out of
    its ``loss_mask``), the old log-probs, the importance weights (None: no weighting) and the
    mismatch metrics and extrema."""

    batch: Mapping[str, Any]
    old: torch.Tensor
    is_weights: torch.Tensor | None
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]]
    extrema: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def log_ratio(self, log_probs: torch.Tensor) -> torch.Tensor:
        """``log_probs - old`` on the trained tokens, 0 elsewhere (with gradient)."""
        import torch

        selected = self.batch["loss_mask"] != 0
        return torch.where(selected, log_probs - self.old, torch.zeros_like(log_probs))

    def ratio(self, log_probs: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``exp(log_ratio)``, the log-ratio clamped to +-MAX_LOG_RATIO (``detach``: a constant)."""
        import torch

        diff = self.log_ratio(log_probs)
        diff = diff.detach() if detach else diff
        return torch.exp(diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def _pg_defaults(
    own: dict[str, Any], aggregation: str = "token-mean", kl_estimator: str = "k1"
) -> dict[str, Any]:
    """A policy-gradient loss's defaults: its ``own`` keys, no KL or entropy term (KL estimated
    by ``kl_estimator`` when set), ``aggregation``, and every rollout correction off."""
    return {
        **own,
        "kl_coef": 0.0,
        "kl_estimator": kl_estimator,
        "entropy_coef": 0.0,
        "aggregation": aggregation,
        **CORRECTION_DEFAULTS,
    }


class CorrectedLoss(BuiltinLoss):
    """A policy-gradient loss: the sampler/trainer mismatch measured whenever the batch has
    ``rollout_log_probs``, and corrected as the rollout-correction keys say."""

    def __call__(self, log_probs: torch.Tensor, batch: Mapping[str, Any], **config: Any) -> Any:
        """Per-micro-batch loss share and metrics (pg_loss, the loss's own, kl, entropy)."""
        config = config or self.configure(None)
        side = self._rollout_side(log_probs, batch, config)
        pg, penalty = self._per_token(log_probs, side, config)
        return self._policy_gradient(pg, log_probs, side, config, penalty)

    def _per_token(
        self, log_probs: torch.Tensor, side: RolloutSide, config: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The per-token policy-gradient term and unweighted penalty (None: none), recording
        the loss's own metrics in ``side.metrics``."""
        raise NotImplementedError  # pragma: no cover

    def normalisers(
        self, config: Mapping[str, Any], whole_batch: Callable[[], Mapping[str, Any]]
    ) -> tuple[float, float] | None:
        """The loss-mask sum and the rows with a kept token once the rejection has run, when
        the batch alone decides it (decoupled, ``old_log_probs`` given); else None.
        ``whole_batch()`` gives the whole batch's ``[B, T]`` tensors."""
        if not config.get("rollout_rs") or config.get("rollout_bypass"):
            return None
        batch = whole_batch()
        old, rollout = batch.get("old_log_probs"), batch.get("rollout_log_probs")
        if old is None or rollout is None:
            return None
        kept = kept_tokens(old, rollout, batch["loss_mask"], config)
        return float(kept.sum()), float((kept != 0).any(dim=-1).sum())

    def weight_scale(
        self, config: Mapping[str, Any], whole_batch: Callable[[], Mapping[str, Any]]
    ) -> float | None:
        """``1 / mean`` of the whole batch's importance weights with
        ``rollout_is_batch_normalize`` (the engine passes it to every micro-batch as
        ``rollout_is_scale``); else None."""
        if not config.get("rollout_is_batch_normalize"):
            return None
        batch = whole_batch()
        old, rollout = batch.get("old_log_probs"), batch.get("rollout_log_probs")
        if old is None or rollout is None:
            return None  # required_fields names what is missing
        return batch_weight_scale(old, rollout, batch["loss_mask"], config)

    def _policy_gradient(
        self,
        pg: torch.Tensor,
        log_probs: torch.Tensor,
        side: RolloutSide,
        config: Mapping[str, Any],
        penalty: torch.Tensor | None = None,
    ) -> LossOutput:
        """The per-token policy-gradient term ``pg`` times the correction's weights, plus an
        unweighted ``penalty`` and the KL and entropy terms, aggregated (primary: pg_loss)."""
        if side.is_weights is not None:
            pg = pg * side.is_weights
        side.metrics["_primary_values"] = (pg, side.batch["loss_mask"])
        per_token = pg if penalty is None else pg + penalty
        per_token = self._regularise(per_token, log_probs, side.batch, config, side.metrics)
        return self._finish(per_token, "pg_loss", side.batch, config, side.metrics, side.extrema)

    def _rollout_side(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, Any]
    ) -> RolloutSide:
        weights = batch["loss_mask"]
        rollout = batch.get("rollout_log_probs")
        given_old = batch.get("old_log_probs")
        bypass = bool(config.get("rollout_bypass"))
        old = rollout if bypass else given_old
        side = RolloutSide(batch, log_probs.detach() if old is None else old, None, {}, {})
        if rollout is None:
            if is_active(config):
                raise LossConfigError(
                    f"loss {self.name!r} has a rollout correction in its loss_config but the "
                    "batch has no 'rollout_log_probs'"
                )
            return side
        # the trainer's side: the old policy when decoupled and given, else this one
        train = log_probs if bypass or given_old is None else given_old
        side.metrics.update(mismatch_metrics(train, rollout, weights))
        side.extrema.update(mismatch_extrema(train, rollout, weights))
        if is_active(config):
            corr = correct(train, rollout, weights, config, batch.get("rollout_is_scale"))
            side.metrics.update(corr.metrics)
            side.extrema.update(corr.extrema)
            side.batch = {**batch, "loss_mask": weights * corr.keep}
            if config.get("rollout_is") is not None:
                side.is_weights = corr.weights
        return side


class PolicyGradientLoss(CorrectedLoss):
    """Token-level clipped-ratio policy gradient (PPO / GRPO), with optional dual clip.

    Per token: ``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` with ``r = exp(logp -
    old_logp)`` (``old_log_probs`` default to the detached current ones, i.e. ``r = 1``); with
    ``clip_ratio_c`` the loss of a negative-advantage token is capped at ``-A c``.
    """

    aliases = {"eps_clip": ("clip_eps_low", "clip_eps_high")}

    def __init__(self, name: str, aggregation: str, kl_estimator: str) -> None:
        self.name = name
        own = {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "clip_ratio_c": None}
        self.defaults = _pg_defaults(own, aggregation, kl_estimator)

    def _per_token(
        self, log_probs: torch.Tensor, side: RolloutSide, config: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Clipped ratio (dual clip with ``clip_ratio_c``); metrics clip_frac, ratio."""
        import torch

        weights = side.batch["loss_mask"]
        advantages = side.batch["advantages"]
        ratio = side.ratio(log_probs)
        low, high = float(config["clip_eps_low"]), float(config["clip_eps_high"])
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
        pg = torch.maximum(unclipped, clipped)
        metrics = side.metrics
        metrics["clip_frac"] = token_metric((clipped > unclipped).to(pg.dtype), weights)
        c = config.get("clip_ratio_c")
        if c is not None:
            cap = -advantages * float(c)
            dual = (advantages < 0) & (pg > cap)
            pg = torch.where(advantages < 0, torch.minimum(pg, cap), pg)
            metrics["dual_clip_frac"] = token_metric(dual.to(pg.dtype), weights)
        metrics["ratio"] = token_metric(ratio, weights)
        return pg, None


class ImportanceSamplingLoss(CorrectedLoss):
    """Unclipped importance-weighted policy gradient: ``-A exp(logp - old_logp)`` per token."""

    name = "importance_sampling"
    defaults = _pg_defaults({})

    def _per_token(
        self, log_probs: torch.Tensor, side: RolloutSide, config: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``-A r``; metric ratio."""
        ratio = side.ratio(log_probs)
        side.metrics["ratio"] = token_metric(ratio, side.batch["loss_mask"])
        return -side.batch["advantages"] * ratio, None


class CISPOLoss(CorrectedLoss):
    """Clipped importance-sampling policy optimisation (MiniMax-M1): per token
    ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp``; the clipped ratio is a constant, so
    every token keeps a gradient (none is dropped by the clip, unlike PPO)."""

    name = "cispo"
    lower_clip_may_reach_zero = True  # clip_eps_low = 1: the ratio is clipped to [0, 1 + high]
    aliases = {"eps_clip": ("clip_eps_low", "clip_eps_high")}
    defaults = _pg_defaults({"clip_eps_low": 1.0, "clip_eps_high": 3.0})

    def _per_token(
        self, log_probs: torch.Tensor, side: RolloutSide, config: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``-sg(clip(r)) A logp``; metrics clip_frac, ratio."""
        weights = side.batch["loss_mask"]
        ratio = side.ratio(log_probs, detach=True)
        low, high = float(config["clip_eps_low"]), float(config["clip_eps_high"])
        clipped = ratio.clamp(max(0.0, 1.0 - low), 1.0 + high)
        pg = -clipped * side.batch["advantages"] * log_probs
        side.metrics["clip_frac"] = token_metric((clipped != ratio).to(pg.dtype), weights)
        side.metrics["ratio"] = token_metric(ratio, weights)
        return pg, None


class DROLoss(CorrectedLoss):
    """Direct reward optimisation's off-policy objective: per token ``-(A logp - beta/2
    (logp - old_logp)^2)``, a policy gradient held near the old policy by a quadratic
    penalty instead of a clip."""

    name = "dro"
    defaults = _pg_defaults({"beta": 0.05})

    def _check(self, config: dict[str, Any]) -> None:
        super()._check(config)
        beta = config.get("beta")
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta >= 0:
            raise LossConfigError(f"loss_config beta={beta!r} must be a number >= 0")
        if not math.isfinite(beta):
            raise LossConfigError(f"loss_config beta={beta!r} must be finite")

    def _per_token(
        self, log_probs: torch.Tensor, side: RolloutSide, config: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``-A logp`` and the penalty ``beta/2 (logp - old_logp)^2``."""
        diff = side.log_ratio(log_probs)
        penalty = 0.5 * float(config["beta"]) * diff * diff
        return -side.batch["advantages"] * log_probs, penalty


class CrossEntropyLoss(BuiltinLoss):
    """Supervised negative log-likelihood of the ``loss_mask`` tokens (SFT)."""

    name = "cross_entropy"
    defaults = {"aggregation": "token-mean"}

    def required_fields(self, config: Mapping[str, Any]) -> set[str]:
        """Nothing beyond ``input_ids`` and ``loss_mask``."""
        return set()

    def __call__(self, log_probs: torch.Tensor, batch: Mapping[str, Any], **config: Any) -> Any:
        """Per-micro-batch loss share and its ``nll`` metric."""
        config = config or self.configure(None)
        nll = -log_probs
        metrics: dict[str, tuple[Any, Any]] = {"_primary_values": (nll, batch["loss_mask"])}
        return self._finish(nll, "nll", batch, config, metrics)


def make_grpo() -> PolicyGradientLoss:
    """GRPO: clipped ratio, sequence-mean of token-means, k3 KL when ``kl_coef`` is set."""
    return PolicyGradientLoss("grpo", aggregation="seq-mean-token-mean", kl_estimator="k3")


def make_ppo() -> PolicyGradientLoss:
    """PPO: clipped ratio (dual clip with ``clip_ratio_c``), token-mean, k1 KL."""
    return PolicyGradientLoss("ppo", aggregation="token-mean", kl_estimator="k1")


def make_importance_sampling() -> ImportanceSamplingLoss:
    """Unclipped importance sampling, token-mean."""
    return ImportanceSamplingLoss()


def make_cispo() -> CISPOLoss:
    """CISPO: a constant clipped ratio times the log-prob's gradient, token-mean."""
    return CISPOLoss()


def make_dro() -> DROLoss:
    """DRO: policy gradient with a quadratic penalty toward the old policy, token-mean."""
    return DROLoss()


def make_cross_entropy() -> CrossEntropyLoss:
    """Cross-entropy (SFT) on the loss-mask tokens, token-mean."""
    return CrossEntropyLoss()


_FACTORIES = {
    "grpo": make_grpo,
    "ppo": make_ppo,
    "importance_sampling": make_importance_sampling,
    "cispo": make_cispo,
    "dro": make_dro,
    "cross_entropy": make_cross_entropy,
}


@hookimpl
def arctic_rl_register_losses() -> Iterator[LossSpec]:
    """grpo, ppo, importance_sampling, cispo, dro and cross_entropy."""
    for name in BUILTIN_LOSSES:
        factory = _FACTORIES[name]
        yield LossSpec(
            name=name,
            factory=factory,
            defaults=dict(factory().defaults),
            description=(factory.__doc__ or "").strip(),
        )
