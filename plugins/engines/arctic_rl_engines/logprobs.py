"""The one forward/log-prob path of the DeepSpeed engines (training, reference, log-prob).

Convention: entry ``i`` of a row's log-probs is ``log p(x_i | x_<i)``; entry 0 is 0.0. Rows
are right-padded, so with causal attention a real token never sees padding and no attention
mask is needed; positions past a row's end are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arctic_rl_engines.microbatch import DUMMY, pad_rows, plan

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class TokenLogProbs:
    """Per-position outputs of one padded forward, all ``[B, T]`` (top-k: ``[B, T, k]``).

    ``top_ids``/``top_log_probs`` at position ``i`` are the ``k`` likeliest tokens for
    position ``i`` (predicted from ``x_<i``); position 0 holds zeros.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_log_probs: torch.Tensor | None = None


def token_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    *,
    entropy: bool = False,
    top_k: int = 0,
    targets: torch.Tensor | None = None,
) -> TokenLogProbs:
    """Forward ``input_ids`` [B, T] through ``model`` (a causal LM or a DeepSpeed engine).

    Entry ``i`` scores ``targets[:, i]`` when ``targets`` [B, T] is given, else ``input_ids``.
    Log-probs, entropy and top-k are computed in float32 whatever the model dtype.
    """
    import torch
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1].float()
    lse = torch.logsumexp(logits, dim=-1)
    scored = (targets if targets is not None else input_ids)[:, 1:]
    picked = logits.gather(-1, scored.unsqueeze(-1)).squeeze(-1)
    out = TokenLogProbs(log_probs=F.pad(picked - lse, (1, 0)))
    if entropy:
        probs = torch.softmax(logits, dim=-1)
        out.entropy = F.pad(lse - (probs * logits).sum(dim=-1), (1, 0))
    if top_k > 0:
        with torch.no_grad():
            k = min(top_k, logits.shape[-1])
            values, ids = logits.detach().topk(k, dim=-1)
            out.top_log_probs = F.pad(values - lse.detach().unsqueeze(-1), (0, 0, 1, 0))
            out.top_ids = F.pad(ids, (0, 0, 1, 0))
    return out


@dataclass
class RowLogProbs:
    """One row's results: log-probs per token, and top-k per position when asked."""

    log_probs: list[float]
    top_ids: list[list[int]] | None = None
    top_log_probs: list[list[float]] | None = None


def rows_log_probs(
    model: Any,
    rows: Sequence[Sequence[int]],
    *,
    device: Any,
    pad_id: int,
    max_tokens: int | None,
    rank: int = 0,
    world: int = 1,
    top_k: int = 0,
    top_k_from: Sequence[int] | None = None,
) -> list[RowLogProbs]:
    """Forward-only log-probs of every row; each rank computes rows ``rank::world`` in
    micro-batches of ``max_tokens`` padded tokens and all ranks receive every row's result.

    ``top_k_from[i]``: the first position of row ``i`` that needs top-k (the rest get none).
    """
    import torch
    import torch.distributed as dist

    lengths = [len(r) for r in rows]
    results: dict[int, RowLogProbs] = {}
    with torch.no_grad():
        for group in plan(lengths, rank, world, max_tokens):
            if group == [DUMMY]:
                model(input_ids=torch.full((1, 2), pad_id, dtype=torch.long, device=device))
                continue
            width = max(lengths[i] for i in group)
            ids = pad_rows([rows[i] for i in group], width, pad_id, torch.long).to(device)
            out = token_log_probs(model, ids, top_k=top_k)
            log_probs = out.log_probs.cpu()
            for j, i in enumerate(group):
                row = RowLogProbs(log_probs=log_probs[j, : lengths[i]].tolist())
                if top_k > 0 and out.top_ids is not None and out.top_log_probs is not None:
                    start = top_k_from[i] if top_k_from is not None else 0
                    row.top_ids = out.top_ids[j, start : lengths[i]].cpu().tolist()
                    row.top_log_probs = out.top_log_probs[j, start : lengths[i]].cpu().tolist()
                results[i] = row
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, results)
        for part in gathered:
            results.update(part)
    return [results[i] for i in range(len(rows))]
