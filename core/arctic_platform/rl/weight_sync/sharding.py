"""Which shard of a full checkpoint tensor a tensor-parallel inference worker holds.

A ``ShardFn`` maps ``(name, full tensor, tp_rank, tp_size)`` to that worker's part; the
coordinator applies it on the receiving side. ``llama_tp_shard`` is the rule for
Llama/Qwen2-style models (the model-specific part of weight sync).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from arctic_platform.rl.weight_sync.buckets import WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import torch

ShardFn = Callable[[str, "torch.Tensor", int, int], "torch.Tensor"]


def llama_tp_shard(name: str, tensor: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The shard a tensor-parallel worker holds of a Llama/Qwen2-style checkpoint tensor:
    column-parallel (q/k/v/gate/up, embeddings, lm_head) split dim 0, row-parallel (o/down)
    split dim 1, everything else (norms, biases of row-parallel layers) whole."""
    if tp_size == 1:
        return tensor
    column = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
    row = ("o_proj", "down_proj")
    if any(f"{part}." in name or name.endswith(part) for part in column):
        dim = 0
    elif any(f"{part}.weight" in name for part in row):
        dim = 1
    else:
        return tensor
    if tensor.shape[dim] % tp_size:
        raise WeightSyncError(
            f"parameter {name!r} of shape {list(tensor.shape)} does not split into {tp_size} "
            f"shards along dim {dim}"
        )
    return tensor.chunk(tp_size, dim=dim)[tp_rank].contiguous()


__all__ = ["ShardFn", "llama_tp_shard"]
