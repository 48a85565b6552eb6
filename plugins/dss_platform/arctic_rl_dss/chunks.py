"""Chunked frames: a large safetensors frame split into chunk envelopes, and their reassembly.

A chunk envelope is itself a frame (``arctic_platform.rl.wire.frames``) holding a ``uint8``
slice of the original frame and a header: index, total, group id, the size and SHA-256 of
the whole frame, the SHA-256 of the slice and the operation. The group id names one logical
upload; for forward-backward it is the idempotency key.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from arctic_platform.rl.api import ArcticRLError, InvalidRequestError, decode_frame, encode_frame

DEFAULT_CHUNK_BYTES = 60 * 1024 * 1024
_HEADER_KEY = "arctic_rl_chunk"
_PAYLOAD_KEY = "payload"


class ChunkError(InvalidRequestError):
    """A chunk that is corrupt (hash mismatch) or not a chunk envelope."""

    code = "invalid_chunk"
    remedy = "Send the chunk again as the client library builds it."


class ChunkConflictError(ArcticRLError):
    """A chunk that contradicts what its group already received (409)."""

    status = 409
    code = "chunk_group_conflict"
    remedy = "Start the upload again under a new chunk group id."


class RestartRequiredError(ArcticRLError):
    """The first chunk the server sees of an unknown group is not chunk 0 (409)."""

    status = 409
    code = "chunk_group_restart_required"
    remedy = "Send the group again from chunk 0."


class ChunkLimitError(ArcticRLError):
    """A user's unfinished uploads hold too many bytes (429)."""

    status = 429
    code = "too_many_pending_chunks"
    remedy = "Finish or abandon your unfinished uploads, then retry."


class ChunkHeader(BaseModel):
    """The header of one chunk envelope."""

    chunk_idx: int = Field(ge=0)
    total_chunks: int = Field(ge=1, le=100_000)
    chunk_group_id: str = Field(min_length=1, max_length=128)
    frame_bytes: int = Field(ge=0)
    frame_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    chunk_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    operation: str = Field(min_length=1, max_length=64)


def sha256(data: bytes | memoryview) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def encode_chunks(
    frame: bytes, operation: str, group_id: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[bytes]:
    """Split ``frame`` into chunk envelopes of at most ``chunk_bytes`` payload each."""
    if chunk_bytes < 1:
        raise InvalidRequestError(f"chunk_bytes must be positive, got {chunk_bytes}")
    total = max(1, math.ceil(len(frame) / chunk_bytes))
    whole = sha256(frame)
    view = memoryview(frame)
    out = []
    for index in range(total):
        piece = view[index * chunk_bytes : (index + 1) * chunk_bytes]
        header = ChunkHeader(
            chunk_idx=index,
            total_chunks=total,
            chunk_group_id=group_id,
            frame_bytes=len(frame),
            frame_sha256=whole,
            chunk_sha256=sha256(piece),
            operation=operation,
        )
        array = np.frombuffer(piece, dtype=np.uint8)
        out.append(encode_frame({_HEADER_KEY: header.model_dump(), _PAYLOAD_KEY: array}))
    return out


def is_chunk(payload: Any) -> bool:
    """Whether a decoded frame payload is a chunk envelope."""
    return isinstance(payload, dict) and _HEADER_KEY in payload


def open_chunk(payload: Any) -> tuple[ChunkHeader, bytes]:
    """The header and checked slice of a decoded chunk envelope; ChunkError if corrupt."""
    if not is_chunk(payload):
        raise ChunkError("the body is not a chunk envelope (no chunk header)")
    try:
        header = ChunkHeader.model_validate(payload[_HEADER_KEY])
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error.get("loc", ()))
        raise ChunkError(f"invalid chunk header: {where}: {error['msg']}") from None
    data = payload.get(_PAYLOAD_KEY)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        raise ChunkError("the chunk payload must be a one-dimensional uint8 tensor")
    raw = data.tobytes()
    if sha256(raw) != header.chunk_sha256:
        raise ChunkError(
            f"chunk {header.chunk_idx} of group {header.chunk_group_id!r} is corrupt: its "
            "SHA-256 does not match its header (nothing was applied; send it again)"
        )
    if header.chunk_idx >= header.total_chunks:
        raise ChunkError(f"chunk index {header.chunk_idx} >= total_chunks {header.total_chunks}")
    return header, raw


def decode_chunk(body: bytes) -> tuple[ChunkHeader, bytes]:
    """``open_chunk`` of a raw chunk envelope body."""
    return open_chunk(decode_frame(body, as_lists=False))


@dataclass
class _Group:
    header: ChunkHeader
    owner: str
    parts: dict[int, bytes] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)


class ChunkAssembler:
    """Collects the chunks of each group (keyed by owner, job and group id) until complete.

    Chunks are kept with the job, not the connection; stale incomplete groups are dropped
    after ``ttl`` seconds.
    """

    def __init__(
        self,
        ttl: float = 3600.0,
        max_frame_bytes: int = 4 * 1024**3,
        max_held_bytes: int = 2 * 1024**3,
    ) -> None:
        self.ttl = ttl
        self.max_frame_bytes = max_frame_bytes
        self.max_held_bytes = max_held_bytes
        self._groups: dict[tuple[str, str, str], _Group] = {}
        self._lock = threading.Lock()

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, g in self._groups.items() if now - g.started > self.ttl]:
            del self._groups[key]

    def add(self, owner: str, job_id: str, header: ChunkHeader, data: bytes) -> bytes | None:
        """Store one chunk; returns the whole frame when this chunk completes the group.

        Raises RestartRequiredError, ChunkConflictError, or ChunkError when the reassembled
        frame's SHA-256 differs from the header (the group is then dropped).
        """
        key = (owner, job_id, header.chunk_group_id)
        if header.frame_bytes > self.max_frame_bytes:
            raise ChunkError(
                f"a frame of {header.frame_bytes} bytes is over the limit of "
                f"{self.max_frame_bytes} bytes"
            )
        with self._lock:
            self._expire()
            group = self._groups.get(key)
            if group is None:
                if header.chunk_idx != 0:
                    raise RestartRequiredError(
                        f"chunk group {header.chunk_group_id!r} is unknown here; send it again "
                        "from chunk 0"
                    )
                group = self._groups[key] = _Group(header, owner)
            else:
                first = group.header
                for name in ("total_chunks", "frame_bytes", "frame_sha256", "operation"):
                    if getattr(first, name) != getattr(header, name):
                        raise ChunkConflictError(
                            f"chunk group {header.chunk_group_id!r} was started with another "
                            f"{name} ({getattr(first, name)!r}, now {getattr(header, name)!r})"
                        )
            seen = group.digests.get(header.chunk_idx)
            if seen is not None and seen != header.chunk_sha256:
                raise ChunkConflictError(
                    f"chunk {header.chunk_idx} of group {header.chunk_group_id!r} was already "
                    "received with other content"
                )
            if header.chunk_idx not in group.parts:
                mine = sum(len(p) for p in group.parts.values())
                if mine + len(data) > header.frame_bytes:
                    if not group.parts:
                        del self._groups[key]
                    raise ChunkError(
                        f"chunk group {header.chunk_group_id!r} would hold {mine + len(data)} "
                        f"bytes, more than its frame_bytes {header.frame_bytes}"
                    )
                held = sum(
                    len(p) for (o, _, _), g in self._groups.items() if o == owner
                    for p in g.parts.values()
                )  # fmt: skip
                if held + len(data) > self.max_held_bytes:
                    raise ChunkLimitError(
                        f"your unfinished uploads already hold {held} bytes (limit "
                        f"{self.max_held_bytes}); finish or abandon them first"
                    )
            group.parts[header.chunk_idx] = data
            group.digests[header.chunk_idx] = header.chunk_sha256
            if len(group.parts) < header.total_chunks:
                return None
            del self._groups[key]
        frame = b"".join(group.parts[i] for i in range(header.total_chunks))
        if len(frame) != header.frame_bytes or sha256(frame) != header.frame_sha256:
            raise ChunkError(
                f"the frame reassembled from group {header.chunk_group_id!r} does not match "
                "its SHA-256 (nothing was applied; send the group again)"
            )
        return frame

    def pending(self, owner: str, job_id: str, group_id: str) -> int | None:
        """How many chunks of an incomplete group arrived (None: no such group in progress)."""
        with self._lock:
            group = self._groups.get((owner, job_id, group_id))
            return None if group is None else len(group.parts)

    def drop_job(self, owner: str, job_id: str) -> None:
        """Forget every incomplete group of a job (on cancel)."""
        with self._lock:
            for key in [k for k in self._groups if k[0] == owner and k[1] == job_id]:
                del self._groups[key]
