"""Wire models and the safetensors frame codec shared by every transport.

A *frame* is a safetensors file whose ``__metadata__`` holds a JSON skeleton of the payload;
arrays (and ragged lists of numbers, flattened with their row lengths) travel as tensors the
skeleton refers to by key. Nothing is ever pickled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from arctic_platform.rl.errors import InvalidRequestError

FRAME_CONTENT_TYPE = "application/octet-stream"
_SKELETON_KEY = "arctic_rl.skeleton"
_TENSOR = "__tensor__"
_RAGGED = "__ragged__"

MAX_NESTING = 64
"""Deepest nesting a frame's skeleton may have; real payloads need a handful of levels."""

BATCH_FIELDS = (
    "input_ids",
    "loss_mask",
    "weights",
    "advantages",
    "old_log_probs",
    "ref_log_probs",
    "target_tokens",
)
PER_TOKEN_FIELDS = ("loss_mask", "old_log_probs", "ref_log_probs")
"""Float fields with one value per token of ``input_ids``. ``weights`` is another name for
``loss_mask`` (per-token loss weights); ``target_tokens[i]`` (for i >= 1), when given, is the
token whose log-prob entry ``i`` scores instead of ``input_ids[i]``: ``log p(target_i | x_<i)``."""


class FrameError(InvalidRequestError):
    """A frame that cannot be decoded (corrupt, oversized or of an unknown layout)."""


class BatchError(InvalidRequestError):
    """A training batch with missing fields, ragged shapes that disagree, or bad values."""


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


def _row_count(name: str, value: Any) -> int:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise BatchError(f"batch field {name!r} must be a list of rows, got {type(value).__name__}")
    return len(value)


def validate_batch(
    batch: Any, *, vocab_size: int | None = None, max_length: int | None = None
) -> dict[str, Any]:
    """Check a training batch's fields and shapes; returns it with ``advantages`` per token.

    Raises BatchError naming the field and row for: missing ``input_ids``, an empty batch,
    rows whose lengths disagree, token ids outside ``[0, vocab_size)``, sequences longer than
    ``max_length``, or non-finite values.
    """
    if not isinstance(batch, dict):
        raise BatchError(f"a batch is a dict of fields, got {type(batch).__name__}")
    unknown = sorted(set(batch) - set(BATCH_FIELDS))
    if unknown:
        raise BatchError(f"unknown batch field(s) {unknown}; known: {list(BATCH_FIELDS)}")
    if "input_ids" not in batch:
        raise BatchError("batch has no 'input_ids'")
    ids = batch["input_ids"]
    n = _row_count("input_ids", ids)
    if n == 0:
        raise BatchError("batch is empty: 'input_ids' has no rows")
    lengths = []
    for i, row in enumerate(ids):
        if not isinstance(row, Sequence) or isinstance(row, str | bytes) or len(row) == 0:
            raise BatchError(f"input_ids[{i}] must be a non-empty list of token ids")
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, int | np.integer):
                raise BatchError(f"input_ids[{i}] holds a non-integer token {tok!r}")
            if tok < 0 or (vocab_size is not None and tok >= vocab_size):
                raise BatchError(
                    f"input_ids[{i}] holds token id {tok} outside the vocabulary "
                    f"[0, {vocab_size if vocab_size is not None else 'inf'})"
                )
        if max_length is not None and len(row) > max_length:
            raise BatchError(
                f"input_ids[{i}] has {len(row)} tokens, more than the model's context {max_length}"
            )
        lengths.append(len(row))
    out: dict[str, Any] = {"input_ids": [list(map(int, r)) for r in ids]}
    batch = _weights_as_loss_mask(batch)
    if batch.get("target_tokens") is not None:
        out["target_tokens"] = _target_tokens(batch["target_tokens"], lengths, vocab_size)
    for name in PER_TOKEN_FIELDS:
        if name not in batch or batch[name] is None:
            continue
        rows = batch[name]
        if _row_count(name, rows) != n:
            raise BatchError(f"{name!r} has {len(rows)} rows, input_ids has {n}")
        for i, row in enumerate(rows):
            if _row_count(f"{name}[{i}]", row) != lengths[i]:
                raise BatchError(
                    f"{name}[{i}] has {len(row)} entries, input_ids[{i}] has {lengths[i]}"
                )
            if any(not math.isfinite(float(x)) for x in row):
                raise BatchError(f"{name}[{i}] holds a NaN or infinite value")
        out[name] = [[float(x) for x in r] for r in rows]
    if "loss_mask" not in out:
        out["loss_mask"] = [[0.0] + [1.0] * (length - 1) for length in lengths]
    if "advantages" in batch and batch["advantages"] is not None:
        adv = batch["advantages"]
        if _row_count("advantages", adv) != n:
            raise BatchError(f"'advantages' has {len(adv)} rows, input_ids has {n}")
        per_token = []
        for i, a in enumerate(adv):
            if isinstance(a, Sequence) and not isinstance(a, str | bytes):
                if len(a) != lengths[i]:
                    raise BatchError(
                        f"advantages[{i}] has {len(a)} entries, input_ids[{i}] has {lengths[i]} "
                        "(give one advantage per sequence or one per token)"
                    )
                row = [float(x) for x in a]
            elif isinstance(a, int | float | np.number) and not isinstance(a, bool):
                row = [float(a)] * lengths[i]
            else:
                raise BatchError(f"advantages[{i}] must be a number or a list, got {a!r}")
            if any(not math.isfinite(x) for x in row):
                raise BatchError(f"advantages[{i}] holds a NaN or infinite value")
            per_token.append(row)
        out["advantages"] = per_token
    if not any(any(x != 0 for x in r) for r in out["loss_mask"]):
        raise BatchError("loss_mask selects no token in the whole batch")
    return out


def _weights_as_loss_mask(batch: dict[str, Any]) -> dict[str, Any]:
    """``weights`` renamed ``loss_mask`` (giving both is an error)."""
    if batch.get("weights") is None:
        return batch
    if batch.get("loss_mask") is not None:
        raise BatchError("give per-token 'weights' or 'loss_mask', not both (they are one field)")
    renamed = {k: v for k, v in batch.items() if k != "weights"}
    renamed["loss_mask"] = batch["weights"]
    return renamed


def _target_tokens(rows: Any, lengths: list[int], vocab_size: int | None) -> list[list[int]]:
    """Checked ``target_tokens``: one token id per token of each ``input_ids`` row."""
    if _row_count("target_tokens", rows) != len(lengths):
        raise BatchError(f"'target_tokens' has {len(rows)} rows, input_ids has {len(lengths)}")
    out = []
    for i, row in enumerate(rows):
        if _row_count(f"target_tokens[{i}]", row) != lengths[i]:
            raise BatchError(
                f"target_tokens[{i}] has {len(row)} entries, input_ids[{i}] has {lengths[i]}"
            )
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, int | np.integer):
                raise BatchError(f"target_tokens[{i}] holds a non-integer token {tok!r}")
            if tok < 0 or (vocab_size is not None and tok >= vocab_size):
                raise BatchError(
                    f"target_tokens[{i}] holds token id {tok} outside the vocabulary "
                    f"[0, {vocab_size if vocab_size is not None else 'inf'})"
                )
        out.append([int(t) for t in row])
    return out
