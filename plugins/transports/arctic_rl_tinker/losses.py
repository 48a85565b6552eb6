"""Tinker's losses as loss plugins: sums over tokens, exactly as the Tinker API defines them.

Registered as ``tinker.cross_entropy``, ``tinker.importance_sampling``, ``tinker.ppo``,
``tinker.cispo`` and ``tinker.dro`` (the built-in ``cross_entropy``/``ppo``/... are
token means). Per token, with ``w`` the batch's ``loss_mask`` (Tinker's ``weights``; 1 on
every real token when none are given), ``lp`` the trained log-prob of the target token,
``q`` the sampler's (``old_log_probs``), ``A`` the advantage and ``r = exp(lp - q)``:

- cross_entropy: ``-w lp``
- importance_sampling: ``-w r A``
- ppo: ``-w min(r A, clip(r, low, high) A)``; ``clip_low_threshold`` (0.8) and
  ``clip_high_threshold`` (1.2) from ``loss_fn_config``
- cispo: ``-w sg(clip(r, low, high)) lp A`` (``sg``: no gradient), same thresholds
- dro: ``-w (lp A - beta/2 (lp - q)^2)``; ``beta`` from ``loss_fn_config`` (default 0.05)

The loss is the sum of these over every token of the batch (each micro-batch returns its
own sum; the sums add up). The losses given the sampler's log-probs also report the
sampler/trainer mismatch (``mismatch_metrics`` and the ratio's extrema: sampler ``q``
against the ``lp`` being trained). Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    LossConfigError,
    LossOutput,
    LossSpec,
    mismatch_extrema,
    mismatch_metrics,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

PREFIX = "tinker."
TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")


class TinkerLoss:
    """One Tinker loss: ``defaults``, ``configure``, ``required_fields`` and the sum itself."""

    tinker_name = "loss"
    defaults: dict[str, float] = {}
    needs_sampler_log_probs = True

    @property
    def name(self) -> str:
        """The registered name (``tinker.<tinker_name>``)."""
        return PREFIX + self.tinker_name

    def configure(self, loss_config: Mapping[str, Any] | None) -> dict[str, float]:
        """``defaults`` overlaid with ``loss_config``; unknown keys or non-numbers raise."""
        given = dict(loss_config or {})
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            raise LossConfigError(
                f"unknown loss_fn_config key(s) {unknown} for loss {self.tinker_name!r}; "
                f"allowed: {sorted(self.defaults)}"
            )
        config = dict(self.defaults)
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LossConfigError(f"loss_fn_config {key}={value!r} must be a number")
            if not math.isfinite(value):
                raise LossConfigError(f"loss_fn_config {key}={value!r} must be finite")
            config[key] = float(value)
        self._check(config)
        return config

    def _check(self, config: dict[str, float]) -> None:
        """Further checks of a merged config (none by default)."""

    def required_fields(self, config: Mapping[str, Any]) -> set[str]:
        """Batch fields this loss needs."""
        return {"advantages", "old_log_probs"} if self.needs_sampler_log_probs else set()

    def needs_entropy(self, config: Mapping[str, Any]) -> bool:
        """Tinker's losses never use the entropy."""
        return False

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """The per-token loss ``[B, T]`` before the weights."""
        raise NotImplementedError  # pragma: no cover

    def __call__(self, log_probs: torch.Tensor, batch: Mapping[str, Any], **config: Any) -> Any:
        """This micro-batch's summed loss and its ``loss`` metric (sum, weighted tokens)."""
        import torch

        config = config or self.configure(None)
        weights = batch["loss_mask"]
        terms = self.per_token(log_probs, batch, config)
        total = torch.where(weights != 0, terms * weights, torch.zeros_like(terms)).sum()
        metrics = {"loss": (total.detach(), weights.sum())}
        extrema = {}
        if self.needs_sampler_log_probs:
            metrics.update(mismatch_metrics(log_probs, batch["old_log_probs"], weights))
            extrema = mismatch_extrema(log_probs, batch["old_log_probs"], weights)
        return LossOutput(loss=total, metrics=metrics, extrema=extrema)


def _ratio(log_probs: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    """``exp(lp - q)`` per token, 1 where the mask is 0 (padding, position 0)."""
    import torch

    selected = batch["loss_mask"] != 0
    diff = torch.where(selected, log_probs - batch["old_log_probs"], torch.zeros_like(log_probs))
    return torch.exp(diff)


class CrossEntropy(TinkerLoss):
    """``-sum w lp``: supervised negative log-likelihood of the weighted target tokens."""

    tinker_name = "cross_entropy"
    needs_sampler_log_probs = False

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """``-lp``."""
        return -log_probs


class ImportanceSampling(TinkerLoss):
    """``-sum w r A``: the unclipped importance-weighted policy gradient."""

    tinker_name = "importance_sampling"

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """``-r A``."""
        return -_ratio(log_probs, batch) * batch["advantages"]


class _Clipped(TinkerLoss):
    defaults = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

    def _check(self, config: dict[str, float]) -> None:
        low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        if not 0 <= low <= high:
            raise LossConfigError(
                f"loss_fn_config needs 0 <= clip_low_threshold <= clip_high_threshold, got "
                f"{low} and {high}"
            )

    @staticmethod
    def _ratios(
        log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ratio ``r`` and ``clip(r, low, high)``."""
        ratio = _ratio(log_probs, batch)
        return ratio, ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])


class PPO(_Clipped):
    """``-sum w min(r A, clip(r, low, high) A)``: the clipped surrogate objective."""

    tinker_name = "ppo"

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """``-min(r A, clip(r) A)``."""
        import torch

        ratio, clipped = self._ratios(log_probs, batch, config)
        advantages = batch["advantages"]
        return -torch.minimum(ratio * advantages, clipped * advantages)


class CISPO(_Clipped):
    """``-sum w sg(clip(r, low, high)) lp A``: clipped importance weights, no gradient."""

    tinker_name = "cispo"

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """``-sg(clip(r)) lp A``."""
        _, clipped = self._ratios(log_probs, batch, config)
        return -clipped.detach() * log_probs * batch["advantages"]


class DRO(TinkerLoss):
    """``-sum w (lp A - beta/2 (lp - q)^2)``: the quadratic-penalty off-policy objective."""

    tinker_name = "dro"
    defaults = {"beta": 0.05}

    def _check(self, config: dict[str, float]) -> None:
        if config["beta"] < 0:
            raise LossConfigError(f"loss_fn_config beta={config['beta']} must be >= 0")

    def per_token(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], config: Mapping[str, float]
    ) -> torch.Tensor:
        """``-(lp A - beta/2 (lp - q)^2)``."""
        import torch

        selected = batch["loss_mask"] != 0
        diff = torch.where(
            selected, log_probs - batch["old_log_probs"], torch.zeros_like(log_probs)
        )
        return -(log_probs * batch["advantages"] - 0.5 * config["beta"] * diff * diff)


_CLASSES: dict[str, type[TinkerLoss]] = {
    "cross_entropy": CrossEntropy,
    "importance_sampling": ImportanceSampling,
    "ppo": PPO,
    "cispo": CISPO,
    "dro": DRO,
}


def make(tinker_name: str) -> TinkerLoss:
    """A fresh loss object for Tinker's loss ``tinker_name``."""
    return _CLASSES[tinker_name]()


def loss_specs() -> Iterator[LossSpec]:
    """One ``LossSpec`` per Tinker loss, its factory imported lazily by name."""
    for tinker_name in TINKER_LOSSES:
        cls = _CLASSES[tinker_name]
        yield LossSpec(
            name=PREFIX + tinker_name,
            factory=f"arctic_rl_tinker.losses:{cls.__name__}",
            defaults=dict(cls.defaults),
            description=f"Tinker's {tinker_name} (a sum over tokens): "
            + (cls.__doc__ or "").strip(),
        )
