"""The safetensors frame codec shared by every transport, and ``validate_batch``.

A *frame* is a safetensors file whose ``__metadata__`` holds a JSON skeleton of the payload;
arrays (and ragged lists of numbers, flattened with their row lengths) travel as tensors the
skeleton refers to by key. Nothing is ever pickled.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from arctic_platform.rl.batch import Batch, BatchLimits
from arctic_platform.rl.errors import FrameError

FRAME_CONTENT_TYPE = "application/octet-stream"
_SKELETON_KEY = "arctic_rl.skeleton"
_TENSOR = "__tensor__"
_RAGGED = "__ragged__"

MAX_NESTING = 64
"""Deepest nesting a frame's skeleton may have; real payloads need a handful of levels."""


def _is_ragged_numeric(value: Any) -> bool:
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        return False
    for row in value:
        for x in row:
            if isinstance(x, bool) or not isinstance(x, int | float):
                return False
    return True


def _ragged_dtype(rows: list[list[Any]]) -> Any:
    if all(isinstance(x, int) for r in rows for x in r):
        return np.int64
    return np.float32


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}

    def _put(self, array: np.ndarray) -> str:
        key = f"t{len(self.tensors)}"
        self.tensors[key] = np.ascontiguousarray(array)
        return key

    def encode(self, value: Any) -> Any:
        if isinstance(value, Batch):  # travels dense: right-padded arrays and their mask
            return self.encode(value.to_padded())
        if isinstance(value, np.ndarray):
            return {_TENSOR: self._put(value)}
        if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, duck-typed
            import torch

            tensor = value.detach().cpu().contiguous()
            if tensor.dtype == torch.bfloat16:
                return {_TENSOR: self._put(tensor.float().numpy()), "dtype": "bfloat16"}
            return {_TENSOR: self._put(tensor.numpy())}
        if _is_ragged_numeric(value):
            lengths = np.array([len(r) for r in value], dtype=np.int64)
            flat = np.array([x for r in value for x in r], dtype=_ragged_dtype(value))
            return {_RAGGED: [self._put(flat), self._put(lengths)]}
        if isinstance(value, dict):
            return {str(k): self.encode(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"__float__": repr(value)}
        return value


def encode_frame(payload: Any) -> bytes:
    """Serialise ``payload`` (JSON-like, with arrays/tensors/ragged lists) into one frame."""
    from safetensors.numpy import save

    enc = _Encoder()
    skeleton = enc.encode(payload)
    return save(enc.tensors, metadata={_SKELETON_KEY: json.dumps(skeleton)})


def decode_frame(data: bytes, *, as_lists: bool = True) -> Any:
    """Inverse of ``encode_frame``; ragged lists come back as lists, arrays as numpy."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    if len(data) < 8:
        raise FrameError(f"frame of {len(data)} bytes is too short to be a safetensors frame")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise FrameError("frame header length exceeds the frame size (truncated or corrupt)")
    try:
        header = json.loads(data[8 : 8 + header_len])
        tensors = load(data)
    except RecursionError:
        raise FrameError("frame header is nested too deeply to be read") from None
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"frame is not valid safetensors: {exc}") from exc
    meta = header.get("__metadata__") or {}
    if _SKELETON_KEY not in meta:
        raise FrameError(f"frame has no {_SKELETON_KEY!r} metadata")
    try:
        skeleton = json.loads(meta[_SKELETON_KEY])
    except RecursionError:
        skeleton = None
    except ValueError as exc:
        raise FrameError(f"frame skeleton is not JSON: {exc}") from exc
    if skeleton is None or _too_deep(skeleton, MAX_NESTING):
        raise FrameError(f"frame skeleton is nested deeper than {MAX_NESTING} levels")

    def tensor(key: Any) -> np.ndarray:
        if not isinstance(key, str) or key not in tensors:
            raise FrameError(f"frame skeleton refers to a missing tensor {key!r}")
        return tensors[key]

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            if _TENSOR in value:
                return tensor(value[_TENSOR])
            if _RAGGED in value:
                flat, lengths = (tensor(k) for k in value[_RAGGED])
                if lengths.ndim != 1 or int(lengths.sum()) != flat.size or (lengths < 0).any():
                    raise FrameError("ragged tensor lengths do not match its data")
                splits = np.split(flat, np.cumsum(lengths)[:-1]) if lengths.size else []
                return [s.tolist() for s in splits] if as_lists else splits
            if "__float__" in value and len(value) == 1:
                return float(value["__float__"])
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    return decode(skeleton)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests dicts/lists more than ``limit`` levels deep."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    if not level:
        return False
    for _ in range(limit):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def validate_batch(
    batch: Any, *, vocab_size: int | None = None, max_length: int | None = None
) -> dict[str, Any]:
    """``Batch.build`` of ``batch`` with these limits, as lists of rows (``advantages`` per
    token); raises BatchError naming the field and row. Code that passes the batch on should
    keep the ``Batch`` itself (``arctic_platform.rl.batch``)."""
    limits = BatchLimits(vocab_size=vocab_size, max_length=max_length)
    return Batch.build(batch, limits=limits).to_lists()


__all__ = [
    "FRAME_CONTENT_TYPE",
    "MAX_NESTING",
    "FrameError",
    "decode_frame",
    "encode_frame",
    "validate_batch",
]
