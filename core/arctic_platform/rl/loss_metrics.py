"""Per-token metrics of a loss: the ``(sum, count)`` of a masked quantity, and the
sampler/trainer mismatch (``MISMATCH_METRICS``) with the ratio's extrema.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arctic_platform.rl.rollout_correction import MAX_LOG_RATIO, log_ratio, masked_extrema

if TYPE_CHECKING:  # pragma: no cover
    import torch


def token_metric(values: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum, count)`` of a per-token quantity over the loss mask, without gradient."""
    import torch

    with torch.no_grad():
        selected = weights != 0
        total = torch.where(selected, values.detach() * weights, torch.zeros_like(values)).sum()
        return total, weights.sum()


MISMATCH_METRICS = (
    "mismatch_k1",
    "mismatch_k2",
    "mismatch_k3",
    "mismatch_ratio",
    "mismatch_chi2",
    "mismatch_chi2_seq",
    "rollout_log_ppl",
    "train_log_ppl",
)
"""What ``mismatch_metrics`` reports: masked token means (``{name}.sum``/``.tokens``), except
``mismatch_chi2_seq``, a mean over the rows with trained tokens."""


def mismatch_metrics(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, weights: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The sampler/trainer mismatch over the loss-mask tokens, as ``(sum, count)`` pairs.

    With ``d = rollout - train`` log-probs per token (tokens drawn by the sampler, policy mu;
    the trainer's policy pi) and ``r = pi/mu = exp(-d)``: ``mismatch_k1`` = d (its mean
    estimates KL(mu||pi), Tinker's ``kl_sample_train_v1``), ``mismatch_k2`` = d^2/2
    (``_v2``), ``mismatch_k3`` = r - 1 + d (unbiased, >= 0), ``mismatch_ratio`` = r,
    ``mismatch_chi2`` = (r - 1)^2 (token-level chi-square), ``mismatch_chi2_seq`` = (prod r)^2
    - 1 per row, ``rollout_log_ppl`` = -rollout and ``train_log_ppl`` = -train (their means are
    log-perplexities). Computed in float64 with ``expm1`` (engines that agree differ by ~1e-7,
    whose k3 of ~1e-14 float32 would round to noise of either sign); ``d`` and a row's sum are
    clamped to +-20. No gradient flows through them.
    """
    import torch

    with torch.no_grad():
        selected = weights != 0
        train = train_log_probs.detach().to(torch.float64)
        rollout = rollout_log_probs.detach().to(torch.float64)
        d = torch.where(selected, rollout - train, torch.zeros_like(train))
        d = d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        r_minus_1 = torch.expm1(-d)
        values = {
            "mismatch_k1": d,
            "mismatch_k2": 0.5 * d * d,
            "mismatch_k3": r_minus_1 + d,
            "mismatch_ratio": r_minus_1 + 1.0,
            "mismatch_chi2": r_minus_1 * r_minus_1,
            "rollout_log_ppl": -rollout,
            "train_log_ppl": -train,
        }
        out = {name: token_metric(values[name], weights) for name in values}
        rows = selected.any(dim=-1)
        seq_log = (-d).sum(dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        chi2_seq = torch.where(rows, torch.expm1(2.0 * seq_log), torch.zeros_like(seq_log))
        out["mismatch_chi2_seq"] = (chi2_seq.sum(), rows.to(torch.float64).sum())
        return {name: out[name] for name in MISMATCH_METRICS}


def mismatch_extrema(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, weights: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``(min, max)`` of the token ratio ``pi/mu`` over the loss-mask tokens
    (``mismatch_ratio.min``/``.max``; +-inf on a micro-batch without any)."""
    import torch

    with torch.no_grad():
        selected = weights != 0
        ratio = torch.exp(log_ratio(train_log_probs, rollout_log_probs, selected))
        return {"mismatch_ratio": masked_extrema(ratio, selected)}
