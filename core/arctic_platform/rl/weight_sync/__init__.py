"""Trainer → inference weight transfer: the static ``TransferSchedule`` and the coordinator.

``WeightSyncCoordinator``, ``SyncReport``, ``WeightSyncError`` and ``WeightMismatchError`` are
imported on first use (module ``__getattr__``), so importing this package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arctic_platform.rl.lazy_names import lazy_names
from arctic_platform.rl.weight_sync.schedule import TopologyError, Transfer, TransferSchedule

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.weight_sync.buckets import WeightMismatchError, WeightSyncError
    from arctic_platform.rl.weight_sync.coordinator import SyncReport, WeightSyncCoordinator

_LAZY = {
    "WeightSyncCoordinator": "arctic_platform.rl.weight_sync.coordinator",
    "SyncReport": "arctic_platform.rl.weight_sync.coordinator",
    "WeightSyncError": "arctic_platform.rl.weight_sync.buckets",
    "WeightMismatchError": "arctic_platform.rl.weight_sync.buckets",
}

__all__ = [
    "SyncReport",
    "TopologyError",
    "Transfer",
    "TransferSchedule",
    "WeightMismatchError",
    "WeightSyncCoordinator",
    "WeightSyncError",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
