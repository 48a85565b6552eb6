"""Where a Tinker server's jobs sit on its GPUs, decided when a model is created.

Every LoRA pool (one base model and LoRA shape: a training and a sampling job) takes
``pool_gpus`` of the server's GPUs (``ARCTIC_RL_TINKER_POOL_GPUS``, default 1), so pools of
different shapes train and sample side by side. With one GPU a pool, its two jobs share that
GPU as colocated jobs of a colocation group of their own (one per GPU: ``tinker-gpu-N``); a
sampler of an untrained base model sits on a GPU beside a pool (a shared bundle holds three
workers) or alone. With two or more, a pool's jobs get GPUs of their own (half each), and so
does a base sampler (the sampling half).

A model that needs a new pool (or base sampler) when no GPUs are left is refused at once
with a 409 naming what holds them, instead of waiting for a placement that cannot come.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arctic_platform.rl.api import WORKERS_PER_COLOCATED_BUNDLE, ArcticRLError, InvalidRequestError
from arctic_rl_tinker.records import Gpus

POOL_WORKERS = 2
"""Workers of a pool on its GPU (training and sampling)."""
BUNDLE_WORKERS = WORKERS_PER_COLOCATED_BUNDLE
"""Colocated workers one GPU bundle holds (the server's limit)."""


class NoGpuRoomError(ArcticRLError):
    """A Tinker model needs GPUs of its own and the server has none left."""

    status = 409
    code = "no_gpu_room"
    remedy = (
        "Create the model with the LoRA settings of a live pool (it then shares that pool), "
        "finish a session that holds GPUs, or serve with more GPUs or a smaller "
        "ARCTIC_RL_TINKER_POOL_GPUS."
    )


def server_gpus(server: object) -> int:
    """The GPUs the server's jobs are placed on: its Ray cluster's (an attached cluster's own
    count), else ``--num-gpus``; at least 1."""
    cluster = getattr(server, "cluster", None)
    resources = getattr(cluster, "resources", None) or {}
    gpus = resources.get("GPU") if isinstance(resources, dict) else None
    if gpus:
        return max(int(gpus), 1)
    return max(int(getattr(server, "num_gpus", 1) or 1), 1)


@dataclass(frozen=True)
class Seat:
    """Where one pool's (or base sampler's) jobs go: their GPU counts and colocation group
    (None: placement groups of their own)."""

    gpus: Gpus
    group: str | None = None


@dataclass
class GpuSeats:
    """The seats taken on ``total`` GPUs, ``pool_gpus`` a pool (callers hold a lock)."""

    total: int
    pool_gpus: int = 1
    _pools: dict[str, int] = field(default_factory=dict)
    """Pool owner -> its GPU (one GPU a pool) or -1 (GPUs of its own)."""
    _bases: dict[str, int] = field(default_factory=dict)
    """Base-sampler owner -> its GPU, or -1."""
    _what: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.pool_gpus <= max(self.total, 1):
            raise InvalidRequestError(
                f"a pool's GPUs ({self.pool_gpus}) must be between 1 and the server's {self.total}"
            )

    def pool_seat(self) -> Seat:
        """The GPU counts of a pool's jobs (its group is chosen by ``take_pool``)."""
        if self.pool_gpus == 1:
            return Seat(Gpus(1, 1, True))
        training = self.pool_gpus // 2
        return Seat(Gpus(training, self.pool_gpus - training, False))

    def take_pool(self, owner: str, what: str) -> Seat:
        """A seat for a new pool ``owner`` (``what`` describes it in refusals); 409 when no
        GPU is free."""
        if self.pool_gpus == 1:
            free = [g for g in range(self.total) if g not in self._pools.values()]
            if not free:
                raise self._full(what, 1)
            gpu = min(free, key=lambda g: sum(1 for b in self._bases.values() if b == g))
            self._seat(self._pools, owner, what, gpu)
            return Seat(Gpus(1, 1, True), f"tinker-gpu-{gpu}")
        if self._used() + self.pool_gpus > self.total:
            raise self._full(what, self.pool_gpus)
        self._seat(self._pools, owner, what, -1)
        return self.pool_seat()

    def take_base(self, owner: str, what: str) -> Seat:
        """A seat for a base model's sampler ``owner``; 409 when no GPU has room."""
        if self.pool_gpus == 1:
            for gpu in range(self.total):
                workers = POOL_WORKERS * sum(1 for p in self._pools.values() if p == gpu)
                workers += sum(1 for b in self._bases.values() if b == gpu)
                if workers < BUNDLE_WORKERS:
                    self._seat(self._bases, owner, what, gpu)
                    return Seat(Gpus(1, 1, True), f"tinker-gpu-{gpu}")
            raise self._full(what, 1)
        need = self.pool_seat().gpus.sampling
        if self._used() + need > self.total:
            raise self._full(what, need)
        self._seat(self._bases, owner, what, -1)
        return Seat(Gpus(1, need, False))

    def release(self, owner: str) -> None:
        """``owner``'s jobs are gone: its GPUs are free again."""
        self._pools.pop(owner, None)
        self._bases.pop(owner, None)
        self._what.pop(owner, None)

    def _seat(self, table: dict[str, int], owner: str, what: str, gpu: int) -> None:
        table[owner] = gpu
        self._what[owner] = what

    def _used(self) -> int:
        """GPUs held by pools and base samplers of their own (two or more GPUs a pool)."""
        base = self.pool_seat().gpus.sampling
        return self.pool_gpus * len(self._pools) + base * len(self._bases)

    def _full(self, what: str, need: int) -> NoGpuRoomError:
        held = "; ".join(self._what[o] for o in [*self._pools, *self._bases]) or "nothing"
        return NoGpuRoomError(
            f"{what} needs {need} GPU(s) of its own and this server's {self.total} GPU(s) are "
            f"all held ({held}); a pool takes {self.pool_gpus} "
            "(ARCTIC_RL_TINKER_POOL_GPUS). Use the LoRA settings of a live pool to share it, "
            "or finish a session that holds GPUs"
        )


__all__ = ["BUNDLE_WORKERS", "GpuSeats", "NoGpuRoomError", "Seat", "server_gpus"]
