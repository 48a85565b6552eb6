"""``TransferSchedule``: the static plan of which training rank sends weights to which target.

Every inference TP worker ``(replica r, tp_rank t)`` is a target with index ``k = r*TP + t``.
Targets are assigned round-robin to ``S = min(training_gpus, R*TP)`` sender ranks
(``sender = k % S``); each (sender, target) pair is its own world of size 2 on port
``base_port + k``. With ``fsdp`` every training rank joins the all-gather first, so a rank
with no target still participates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arctic_platform.rl.errors import TopologyError

Sharding = Literal["dp", "fsdp"]
MAX_PORT = 65535


@dataclass(frozen=True)
class Transfer:
    """One (sender rank → inference worker) pair and the port its world of two meets on."""

    sender: int
    replica: int
    tp_rank: int
    port: int

    @property
    def target(self) -> tuple[int, int]:
        return (self.replica, self.tp_rank)


@dataclass(frozen=True)
class TransferSchedule:
    """The full plan for one topology; build it with ``TransferSchedule.build``."""

    training_sharding: Sharding
    training_gpus: int
    inference_replicas: int
    inference_tp: int
    base_port: int
    transfers: tuple[Transfer, ...]

    @classmethod
    def build(
        cls,
        training_sharding: str,
        training_gpus: int,
        inference_replicas: int,
        inference_tp: int,
        base_port: int = 29500,
    ) -> TransferSchedule:
        """Plan the transfers; raises TopologyError for a topology that cannot work."""
        if training_sharding not in ("dp", "fsdp"):
            raise TopologyError(
                f"training_sharding {training_sharding!r} is not one of ['dp', 'fsdp']"
            )
        for name, value in (
            ("training_gpus", training_gpus),
            ("inference_replicas", inference_replicas),
            ("inference_tp", inference_tp),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"{name} must be an integer >= 1, got {value!r}")
        targets = inference_replicas * inference_tp
        last_port = base_port + targets - 1
        if base_port < 1 or last_port > MAX_PORT:
            raise TopologyError(
                f"ports {base_port}..{last_port} for {inference_replicas} replicas x tp "
                f"{inference_tp} do not fit in 1..{MAX_PORT}"
            )
        senders = min(training_gpus, targets)
        transfers = tuple(
            Transfer(
                sender=k % senders,
                replica=k // inference_tp,
                tp_rank=k % inference_tp,
                port=base_port + k,
            )
            for k in range(targets)
        )
        sharding: Sharding = "fsdp" if training_sharding == "fsdp" else "dp"
        return cls(
            sharding,
            training_gpus,
            inference_replicas,
            inference_tp,
            base_port,
            transfers,
        )

    @property
    def num_senders(self) -> int:
        """Training ranks that send (the others only join the fsdp gather)."""
        return min(self.training_gpus, self.inference_replicas * self.inference_tp)

    @property
    def gather_ranks(self) -> tuple[int, ...]:
        """Ranks that must join the all-gather before sending (all of them with fsdp)."""
        if self.training_sharding == "fsdp":
            return tuple(range(self.training_gpus))
        return ()

    def for_sender(self, rank: int) -> tuple[Transfer, ...]:
        """The transfers training rank ``rank`` sends (empty for a rank with no target)."""
        if not 0 <= rank < self.training_gpus:
            raise TopologyError(f"training rank {rank} is outside 0..{self.training_gpus - 1}")
        return tuple(t for t in self.transfers if t.sender == rank)

    def for_target(self, replica: int, tp_rank: int) -> Transfer:
        """The one transfer that feeds inference worker ``(replica, tp_rank)``."""
        for t in self.transfers:
            if t.target == (replica, tp_rank):
                return t
        raise TopologyError(
            f"no inference worker (replica {replica}, tp_rank {tp_rank}) in a topology of "
            f"{self.inference_replicas} replicas x tp {self.inference_tp}"
        )

    @classmethod
    def from_config(cls, config: object) -> TransferSchedule:
        """Build from a ``WeightSyncConfig``."""
        return cls.build(
            config.training_sharding,  # type: ignore[attr-defined]
            config.training_gpus,  # type: ignore[attr-defined]
            config.inference_replicas,  # type: ignore[attr-defined]
            config.inference_tp,  # type: ignore[attr-defined]
            config.base_port,  # type: ignore[attr-defined]
        )
