"""Bucket plans: how a ``(name, tensor)`` stream is cut into byte buckets, and the checks on it.

A plan is sent (as JSON) before any bytes, so a receiver can reject a name, shape or dtype
mismatch up front. Tensors of a received bucket are views into the bucket buffer: no copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.errors import WeightMismatchError, WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor sits in its bucket."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """One transfer unit: tensors packed back to back, ``nbytes`` in all."""

    index: int
    nbytes: int
    tensors: tuple[TensorMeta, ...]


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32, and so on."""
    return str(dtype).removeprefix("torch.")


DIRECT_BYTES = 1024 * 1024


def plan_buckets(
    named: Sequence[tuple[str, torch.Tensor]], bucket_size: int, direct_bytes: int = DIRECT_BYTES
) -> list[Bucket]:
    """Cut tensors, in order, into buckets of at most ``bucket_size`` bytes.

    A tensor of ``direct_bytes`` or more (or bigger than a bucket) gets a bucket of its own,
    which ``pack`` sends straight from the tensor's memory: packing copies cost more than
    extra messages do."""
    if bucket_size <= 0:
        raise ValueError(f"bucket_size must be > 0, got {bucket_size}")
    buckets: list[Bucket] = []
    current: list[TensorMeta] = []
    offset = 0
    seen: set[str] = set()
    for name, tensor in named:
        if name in seen:
            raise WeightSyncError(f"parameter {name!r} appears twice in the weight stream")
        seen.add(name)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= min(direct_bytes, bucket_size):
            if current:
                buckets.append(Bucket(len(buckets), offset, tuple(current)))
                current, offset = [], 0
            meta = TensorMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape), 0, nbytes)
            buckets.append(Bucket(len(buckets), nbytes, (meta,)))
            continue
        if current and offset + nbytes > bucket_size:
            buckets.append(Bucket(len(buckets), offset, tuple(current)))
            current, offset = [], 0
        current.append(
            TensorMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, nbytes)
        )
        offset += nbytes
        # keep every tensor 64-byte aligned inside its bucket so views are aligned
        offset = (offset + 63) // 64 * 64
    if current:
        buckets.append(Bucket(len(buckets), offset, tuple(current)))
    return buckets


def plan_to_json(buckets: Sequence[Bucket], version: int) -> str:
    """The plan as JSON, sent ahead of the bytes."""
    return json.dumps(
        {
            "version": version,
            "buckets": [
                {
                    "index": b.index,
                    "nbytes": b.nbytes,
                    "tensors": [
                        [t.name, t.dtype, list(t.shape), t.offset, t.nbytes] for t in b.tensors
                    ],
                }
                for b in buckets
            ],
        }
    )


def plan_from_json(text: str) -> tuple[int, list[Bucket]]:
    """Inverse of ``plan_to_json``."""
    data = json.loads(text)
    buckets = [
        Bucket(
            b["index"],
            b["nbytes"],
            tuple(TensorMeta(n, d, tuple(s), o, nb) for n, d, s, o, nb in b["tensors"]),
        )
        for b in data["buckets"]
    ]
    return int(data["version"]), buckets


Expected = Mapping[str, tuple[tuple[int, ...], str | None]]


def check_plan(buckets: Iterable[Bucket], expected: Expected | None) -> None:
    """Raise WeightMismatchError naming the parameter if the plan does not fit ``expected``
    (name -> (shape, dtype or None for any)); every expected name must be present."""
    if expected is None:
        return
    names: set[str] = set()
    for bucket in buckets:
        for t in bucket.tensors:
            names.add(t.name)
            if t.name not in expected:
                raise WeightMismatchError(
                    f"the sender has parameter {t.name!r} that the receiver does not know"
                )
            shape, dtype = expected[t.name]
            if tuple(shape) != tuple(t.shape):
                raise WeightMismatchError(
                    f"parameter {t.name!r}: sender shape {list(t.shape)}, receiver expects "
                    f"{list(shape)}"
                )
            if dtype is not None and dtype != t.dtype:
                raise WeightMismatchError(
                    f"parameter {t.name!r}: sender dtype {t.dtype}, receiver expects {dtype}"
                )
    missing = sorted(set(expected) - names)
    if missing:
        raise WeightMismatchError(
            f"the sender did not send {len(missing)} parameter(s) the receiver needs, "
            f"e.g. {missing[:3]}"
        )


def direct_view(bucket: Bucket, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The bucket's bytes as a view of its one contiguous tensor (no copy), else None."""
    if len(bucket.tensors) != 1 or bucket.tensors[0].nbytes != bucket.nbytes:
        return None
    tensor = tensors[bucket.tensors[0].name].detach()
    if not tensor.is_contiguous():
        return None
    return tensor.reshape(-1).view(_uint8())


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy the bucket's tensors into ``out`` (uint8, at least ``bucket.nbytes``)."""
    buf = out[: bucket.nbytes]
    for t in bucket.tensors:
        src = tensors[t.name].detach().contiguous().reshape(-1).view(_uint8())
        buf[t.offset : t.offset + t.nbytes].copy_(src)
    return buf


def unpack(bucket: Bucket, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into ``buf`` with each tensor's dtype and shape (no copy)."""
    import torch

    out = []
    for t in bucket.tensors:
        dtype = getattr(torch, t.dtype)
        out.append((t.name, buf[t.offset : t.offset + t.nbytes].view(dtype).view(t.shape)))
    return out


def _uint8() -> Any:
    import torch

    return torch.uint8


_ST_DTYPES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def expected_from_checkpoint(model_dir: str | Path, check_dtype: bool = False) -> dict[str, Any]:
    """Parameter names and shapes from the safetensors headers of a Hugging Face checkpoint
    directory (reads headers only, no tensor data)."""
    out: dict[str, Any] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightSyncError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _ST_DTYPES.get(info["dtype"], info["dtype"].lower()) if check_dtype else None
            out[name] = (tuple(info["shape"]), dtype)
    return out
