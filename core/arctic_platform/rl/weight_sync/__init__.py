"""Trainer → inference weight transfer: the static ``TransferSchedule`` and the coordinator."""

from arctic_platform.rl.weight_sync.schedule import TopologyError, Transfer, TransferSchedule

__all__ = ["TopologyError", "Transfer", "TransferSchedule"]
