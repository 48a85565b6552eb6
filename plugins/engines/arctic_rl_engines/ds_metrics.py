"""Metrics and per-row results of a training pass, summed over micro-batches and ranks.

Each rank sums ``(value sum, token count)`` pairs over its micro-batches (``add_metrics``)
and keeps the least and greatest of ``(min, max)`` pairs (``add_extrema``); ``reduce_metrics``
combines them over the job's ranks (every rank gets the same answer) and ``gather_rows``
joins each rank's rows in row order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arctic_platform.rl.api import EngineError, effective_sample_size


def add_metrics(sums: dict[str, list[Any]], metrics: Mapping[str, Any]) -> None:
    """Add one micro-batch's ``{name: (sum, count)}`` to ``sums`` (float64 tensors)."""
    import torch

    for name, (total, count) in metrics.items():
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] = acc[0] + total.detach().to(torch.float64)
        acc[1] = acc[1] + torch.as_tensor(count).detach().to(torch.float64)


def add_extrema(lows_highs: dict[str, list[Any]], extrema: Mapping[str, Any]) -> None:
    """Fold one micro-batch's ``{name: (min, max)}`` into ``lows_highs`` (float64 tensors)."""
    import torch

    for name, (low, high) in extrema.items():
        low = low.detach().to(torch.float64).cpu()
        high = high.detach().to(torch.float64).cpu()
        acc = lows_highs.get(name)
        if acc is None:
            lows_highs[name] = [low, high]
        else:
            acc[0], acc[1] = torch.minimum(acc[0], low), torch.maximum(acc[1], high)


def _agreed(names: Any, world: int) -> None:
    """Check that every rank reports the same ``names`` (one gather; every rank calls it)."""
    import torch.distributed as dist

    if world > 1:
        seen: list[Any] = [None] * world
        dist.all_gather_object(seen, names)
        if any(s != names for s in seen):
            raise EngineError(f"ranks report different metrics: {seen}")


def _reduce_extrema(lows_highs: dict[str, list[Any]], world: int) -> dict[str, float]:
    """``{name}.min``/``{name}.max`` over all ranks (whose names agree: ``reduce_metrics``
    checks them); a name no token reached is left out."""
    import math

    import torch
    import torch.distributed as dist

    names = sorted(lows_highs)
    if not names:
        return {}
    lows = torch.stack([lows_highs[n][0] for n in names])
    highs = torch.stack([lows_highs[n][1] for n in names])
    if world > 1:
        dist.all_reduce(lows, op=dist.ReduceOp.MIN)
        dist.all_reduce(highs, op=dist.ReduceOp.MAX)
    out: dict[str, float] = {}
    for name, low, high in zip(names, lows.tolist(), highs.tolist(), strict=True):
        if math.isfinite(low) and math.isfinite(high):
            out[f"{name}.min"], out[f"{name}.max"] = low, high
    return out


def gather_rows(mine: dict[int, list[float]], count: int, world: int) -> list[list[float]]:
    """Every rank's rows (a dict row index -> values) joined in row order on every rank."""
    import torch.distributed as dist

    rows = dict(mine)
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        for part in gathered:
            rows.update(part)
    return [rows[i] for i in range(count)]


def reduce_metrics(
    sums: dict[str, list[Any]],
    num_tokens: float,
    num_seqs: float,
    passes: int,
    world: int,
    extrema: dict[str, list[Any]] | None = None,
) -> dict[str, float]:
    """``{name}.sum``, ``{name}.tokens`` and their ratio ``name`` over all ranks, the
    extrema's ``{name}.min``/``{name}.max``, the effective sample size of a rollout
    correction's weights (``rollout_is_ess``), plus the batch's ``tokens``, ``sequences`` and
    this rank's ``micro_batches``."""
    import torch
    import torch.distributed as dist

    names = sorted(sums)
    _agreed((names, sorted(extrema or {})), world)
    flat = [torch.as_tensor(v, dtype=torch.float64).cpu() for n in names for v in sums[n]]
    vec = torch.stack(flat) if flat else torch.zeros(0, dtype=torch.float64)
    if world > 1 and vec.numel():
        dist.all_reduce(vec)
    values = vec.tolist()
    metrics: dict[str, float] = {}
    for i, name in enumerate(names):
        total, count = values[2 * i], values[2 * i + 1]
        metrics[f"{name}.sum"] = total
        metrics[f"{name}.tokens"] = count
        metrics[name] = total / count if count else 0.0
    metrics.update(_reduce_extrema(extrema or {}, world))
    ess = effective_sample_size(metrics)
    if ess is not None:
        metrics["rollout_is_ess"] = ess
    metrics["tokens"] = num_tokens
    metrics["sequences"] = num_seqs
    metrics["micro_batches"] = float(passes)
    return metrics
