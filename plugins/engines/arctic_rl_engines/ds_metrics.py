"""Metrics and per-row results of a training pass, summed over micro-batches and ranks.

Each rank sums ``(value sum, token count)`` pairs over its micro-batches (``add_metrics``);
``reduce_metrics`` adds them over the job's ranks (every rank gets the same answer) and
``gather_rows`` joins each rank's rows in row order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arctic_platform.rl.api import EngineError


def add_metrics(sums: dict[str, list[Any]], metrics: Mapping[str, Any]) -> None:
    """Add one micro-batch's ``{name: (sum, count)}`` to ``sums`` (float64 tensors)."""
    import torch

    for name, (total, count) in metrics.items():
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] = acc[0] + total.detach().to(torch.float64)
        acc[1] = acc[1] + torch.as_tensor(count).detach().to(torch.float64)


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
    sums: dict[str, list[Any]], num_tokens: float, num_seqs: float, passes: int, world: int
) -> dict[str, float]:
    """``{name}.sum``, ``{name}.tokens`` and their ratio ``name`` over all ranks, plus the
    batch's ``tokens``, ``sequences`` and this rank's ``micro_batches``."""
    import torch
    import torch.distributed as dist

    names = sorted(sums)
    if world > 1:
        seen: list[Any] = [None] * world
        dist.all_gather_object(seen, names)
        if any(s != names for s in seen):
            raise EngineError(f"ranks report different metrics: {seen}")
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
    metrics["tokens"] = num_tokens
    metrics["sequences"] = num_seqs
    metrics["micro_batches"] = float(passes)
    return metrics
