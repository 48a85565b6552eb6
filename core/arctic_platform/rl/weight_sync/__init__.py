"""Trainer → inference weight transfer: the static ``TransferSchedule`` and the coordinator.

``WeightSyncCoordinator``, ``SyncReport``, ``WeightSyncError`` and ``WeightMismatchError`` are
imported on first use (module ``__getattr__``), so importing this package stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """Import the heavier names of ``__all__`` when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazy ones included."""
    return sorted({*globals(), *_LAZY})
