"""``WeightSyncCoordinator`` is importable from ``arctic_platform.rl.weight_sync`` cheaply."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys
from arctic_platform.rl.weight_sync import WeightSyncCoordinator, SyncReport, WeightSyncError
heavy = [m for m in ("torch", "ray", "vllm", "deepspeed", "transformers") if m in sys.modules]
assert not heavy, heavy
from arctic_platform.rl.weight_sync import coordinator, buckets
assert WeightSyncCoordinator is coordinator.WeightSyncCoordinator
assert SyncReport is coordinator.SyncReport and WeightSyncError is buckets.WeightSyncError
"""


def test_coordinator_imports_from_the_package_without_torch() -> None:
    subprocess.run([sys.executable, "-c", PROGRAM], check=True)


def test_package_lists_its_lazy_names_and_refuses_unknown_ones() -> None:
    import arctic_platform.rl.weight_sync as weight_sync

    assert {"WeightSyncCoordinator", "TransferSchedule"} <= set(weight_sync.__all__)
    assert "WeightSyncCoordinator" in dir(weight_sync)
    with pytest.raises(AttributeError, match="NoSuchThing"):
        weight_sync.NoSuchThing  # noqa: B018
