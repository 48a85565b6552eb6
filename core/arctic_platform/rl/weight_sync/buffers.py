"""``BufferCache``: byte regions kept between syncs, so repeated syncs touch no fresh pages.

A fresh multi-MiB buffer page-faults on first touch, which cost more than the copies into
it on CPU. One flat region is kept per use (a sender's packing slots per target, a
receiver's bucket buffers) and cut into the buffers a sync needs; it is replaced only when
it is too small, much too big, or on another device.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

SLACK = 1.25  # a kept region up to this much bigger than needed is reused


class BufferCache:
    """Reusable uint8 buffers by use; what ``get`` returns stays valid until the next ``get``
    for the same use (received tensors are views into them)."""

    def __init__(self) -> None:
        self._regions: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, use: str, sizes: Sequence[int], device: str) -> list[torch.Tensor]:
        """Buffers of ``sizes`` bytes on ``device`` for ``use``, cut from the kept region."""
        import torch

        need = sum(int(n) for n in sizes)
        with self._lock:
            region = self._regions.get(use)
            if region is None or not _fits(region, need, str(device)):
                self._regions.pop(use, None)  # free the old region before allocating anew
                del region
                region = torch.empty(max(need, 1), dtype=torch.uint8, device=device)
                self._regions[use] = region
        out, offset = [], 0
        for n in sizes:
            out.append(region[offset : offset + int(n)])
            offset += int(n)
        return out

    def nbytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return sum(r.numel() for r in self._regions.values())

    def clear(self) -> None:
        """Drop every region."""
        with self._lock:
            self._regions.clear()


def _fits(region: torch.Tensor, need: int, device: str) -> bool:
    import torch

    same_device = region.device == torch.device(device)
    return same_device and need <= region.numel() <= max(need, 1) * SLACK
