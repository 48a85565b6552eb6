"""Training batches as they arrive in frames: dense padded tensors become ragged rows.

A client may send ``input_ids`` (and per-token fields) as dense ``[batch, seq]`` arrays with a
right-padded ``attention_mask``; the platform trims each row to its length before the batch
is validated, so padding costs transfer but no compute.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arctic_platform.rl.api import PER_TOKEN_FIELDS, BatchError


def _trim(name: str, value: Any, lengths: np.ndarray) -> Any:
    if not isinstance(value, np.ndarray):
        return value
    if value.ndim != 2 or value.shape[0] != lengths.shape[0]:
        raise BatchError(
            f"{name!r} is an array of shape {list(value.shape)}; with a dense input_ids of "
            f"{lengths.shape[0]} rows it must be [{lengths.shape[0]}, seq]"
        )
    return [value[i, : int(n)].tolist() for i, n in enumerate(lengths)]


def dense_to_rows(batch: Any) -> Any:
    """``batch`` with dense 2-D arrays cut to ragged lists by ``attention_mask`` (dropped)."""
    if not isinstance(batch, dict):
        return batch
    out = dict(batch)
    mask = out.pop("attention_mask", None)
    ids = out.get("input_ids")
    if not isinstance(ids, np.ndarray):
        if mask is not None:
            raise BatchError("attention_mask is only accepted with a dense input_ids array")
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    if ids.ndim != 2 or ids.shape[0] == 0:
        raise BatchError(f"a dense input_ids must be [batch, seq], got shape {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise BatchError(f"a dense input_ids must hold integers, got {ids.dtype}")
    if mask is None:
        lengths = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
    else:
        if not isinstance(mask, np.ndarray) or mask.shape != ids.shape:
            raise BatchError(f"attention_mask must be an array of input_ids' shape {ids.shape}")
        keep = mask != 0
        lengths = keep.sum(axis=1)
        expected = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        if not np.array_equal(keep, expected):
            raise BatchError("attention_mask must be right-padded: ones, then zeros, per row")
    out["input_ids"] = _trim("input_ids", ids, lengths)
    for name in PER_TOKEN_FIELDS:
        if name in out:
            out[name] = _trim(name, out[name], lengths)
    adv = out.get("advantages")
    if isinstance(adv, np.ndarray):
        out["advantages"] = adv.tolist() if adv.ndim == 1 else _trim("advantages", adv, lengths)
    return out
