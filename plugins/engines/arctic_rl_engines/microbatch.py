"""Row sharding over ranks and token-budget micro-batches, planned identically on every rank.

Every rank receives the whole batch, takes rows ``rank::world`` and plans the micro-batches
of every rank, so all ranks agree without talking on how many forward/backward passes there
will be (ZeRO-3 gathers parameters collectively in each one). A rank with fewer passes than
the most loaded one runs dummy passes whose loss weights are all zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

DUMMY = -1  # a planned pass of a rank that has no rows left: forward a 2-token row, weight 0


def shard_rows(num_rows: int, rank: int, world: int) -> list[int]:
    """The rows rank ``rank`` of ``world`` takes: ``rank, rank + world, ...``."""
    return list(range(rank, num_rows, world))


def split_by_budget(
    rows: Sequence[int], lengths: Sequence[int], max_tokens: int | None
) -> list[list[int]]:
    """Group ``rows`` into micro-batches of at most ``max_tokens`` padded tokens each.

    Rows are taken longest first (less padding); a micro-batch costs ``rows x longest row``.
    A row longer than the budget goes alone. ``max_tokens=None``: one micro-batch.
    """
    if not rows:
        return []
    if max_tokens is None:
        return [list(rows)]
    ordered = sorted(rows, key=lambda r: (-lengths[r], r))
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in ordered:
        width = max(longest, lengths[r])
        if current and width * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, width = [], lengths[r]
        current.append(r)
        longest = width
    groups.append(current)
    return groups


def plan(lengths: Sequence[int], rank: int, world: int, max_tokens: int | None) -> list[list[int]]:
    """This rank's micro-batches (row indices), padded with ``[DUMMY]`` to the busiest rank."""
    per_rank = [
        split_by_budget(shard_rows(len(lengths), r, world), lengths, max_tokens)
        for r in range(world)
    ]
    passes = max(len(p) for p in per_rank)
    mine = per_rank[rank]
    return mine + [[DUMMY]] * (passes - len(mine))


def pad_rows(
    rows: Sequence[Sequence[Any]], width: int, value: float | int, dtype: torch.dtype
) -> torch.Tensor:
    """Right-pad ragged ``rows`` to ``width`` with ``value``: one ``[len(rows), width]`` tensor."""
    import numpy as np
    import torch

    np_dtype = np.int64 if dtype in (torch.long, torch.int64) else np.float32
    out = np.full((len(rows), width), value, dtype=np_dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out).to(dtype)
