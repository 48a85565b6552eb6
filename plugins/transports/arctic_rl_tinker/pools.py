"""LoRA pools: the Tinker models of one base model and one LoRA shape share two jobs.

A pool is one training job (a named adapter per model: one live in the model's LoRA
parameters, the others parked on the host with their optimizer state and pending gradients)
and one sampling job (every model's adapter versions, and the base as adapter ``base``). A
model whose LoRA settings differ in anything the jobs are built with (rank, alpha, target
modules, dropout) gets its own pool; the seed only draws its adapter's ``lora_A``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arctic_platform.rl.api import JobError

PoolKey = tuple[str, int, float, tuple[str, ...], float]
"""(base model, rank, alpha, target modules, dropout): what a pool's jobs are built with."""


def pool_key(base_model: str, lora: dict[str, Any]) -> PoolKey:
    """The pool a model of ``base_model`` with ``training_config.lora`` ``lora`` belongs to."""
    return (
        base_model,
        int(lora["rank"]),
        float(lora["alpha"]),
        tuple(sorted(lora["target_modules"])),
        float(lora.get("dropout", 0.0)),
    )


def describe_shape(key: PoolKey) -> str:
    """A pool's base model and LoRA shape, for messages."""
    base, rank, alpha, targets, _ = key
    return f"LoRA rank {rank} alpha {alpha:g} on {'/'.join(targets)} of {base}"


def adapter_name(model_id: str) -> str:
    """The adapter a model trains in its pool: unique per model id, a valid adapter name
    (a model id holds ``:``, which adapter names may not)."""
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:20]
    return f"model-{digest}"


@dataclass
class Pool:
    """One pool's jobs and members; ``ready`` is set once both jobs run (or ``error`` says why
    they could not)."""

    key: PoolKey
    lora: dict[str, Any]
    training_job: int | None = None
    sampling_job: int | None = None
    members: set[str] = field(default_factory=set)
    ready: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    closed: bool = False
    seat: Any = None
    """Where its jobs sit on the server's GPUs (``gpu_seats.Seat``)."""
    owner: str = ""
    """Its name in the server's GPU seats."""

    @property
    def base_model(self) -> str:
        """The base model both jobs load."""
        return self.key[0]

    def jobs(self) -> list[int]:
        """The ids of the jobs started so far."""
        return [j for j in (self.training_job, self.sampling_job) if j is not None]

    def wait(self, timeout: float) -> None:
        """Block until the jobs run; JobError when they failed or took longer than
        ``timeout``."""
        if not self.ready.wait(timeout):
            raise JobError(f"the LoRA pool of {self.base_model} was not ready after {timeout}s")
        if self.error is not None:
            raise JobError(f"the LoRA pool of {self.base_model} could not start: {self.error}")


class Pools:
    """The live pools by key (callers hold their own lock around every method)."""

    def __init__(self) -> None:
        self.by_key: dict[PoolKey, Pool] = {}

    def live(self, key: PoolKey) -> Pool | None:
        """The live pool of ``key``, if any (a model of ``key`` would join it)."""
        pool = self.by_key.get(key)
        return None if pool is None or pool.closed or pool.error is not None else pool

    def join(
        self, key: PoolKey, lora: dict[str, Any], model_id: str, seat: Any = None, owner: str = ""
    ) -> tuple[Pool, bool]:
        """The pool ``model_id`` joins (a new one, seated at ``seat`` as ``owner``, when none
        of ``key`` is live) and whether it is new (its jobs are the caller's to start)."""
        pool = self.live(key)
        new = pool is None
        if pool is None:
            pool = Pool(key, lora, seat=seat, owner=owner)
            self.by_key[key] = pool
        pool.members.add(model_id)
        return pool, new

    def leave(self, pool: Pool, model_id: str) -> bool:
        """Take ``model_id`` out of ``pool``; True when it was the last member (the pool is
        closed and forgotten: its jobs are the caller's to destroy)."""
        pool.members.discard(model_id)
        if pool.members:
            return False
        pool.closed = True
        if self.by_key.get(pool.key) is pool:
            del self.by_key[pool.key]
        return True

    def sampling_job(self, base_model: str) -> int | None:
        """A running pool's sampling job of ``base_model`` (it serves the base as ``base``)."""
        for pool in self.by_key.values():
            ready = pool.ready.is_set() and pool.error is None and not pool.closed
            if ready and pool.base_model == base_model and pool.sampling_job is not None:
                return pool.sampling_job
        return None

    def forget(self, pool: Pool) -> None:
        """Drop a pool whose jobs could not start (the next model of its key starts anew)."""
        if self.by_key.get(pool.key) is pool:
            del self.by_key[pool.key]


def start_pool(
    pool: Pool, start_job: Callable[[str], int], wait_running: Callable[[int], None]
) -> None:
    """Start ``pool``'s training and sampling jobs and wait for both; on failure the pool keeps
    the error (its waiting members fail with it) and the exception goes on."""
    try:
        pool.training_job = start_job("training")
        pool.sampling_job = start_job("sampling")
        wait_running(pool.training_job)
        wait_running(pool.sampling_job)
    except BaseException as exc:
        pool.error = str(exc) or type(exc).__name__
        raise
    finally:
        pool.ready.set()


__all__ = [
    "Pool",
    "PoolKey",
    "Pools",
    "adapter_name",
    "describe_shape",
    "pool_key",
    "start_pool",
]
