"""Where a job's workers go: a placement group of its own, or the bundles colocated jobs
share; and the check, when a job is created, that the cluster could ever hold it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.errors import InvalidRequestError

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.server.job_state import Job

COLOCATED_GPU_FRACTION = 0.3  # three roles share one bundle


def cluster_gpus() -> float | None:
    """All GPUs of the Ray cluster this process is attached to (None when not attached)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return float(ray.cluster_resources().get("GPU", 0.0))


def check_cluster_has(job_type: str, config: Any) -> None:
    """422 for a job that asks for more GPUs than the whole cluster has: it could never place.

    A colocated job needs as many bundles as its largest role; others need their own count.
    """
    total = cluster_gpus()
    if total is None:
        return
    fields = ["training_gpus", "sampling_gpus", "log_prob_gpus"]
    field = max(fields, key=lambda f: getattr(config, f)) if config.colocate else f"{job_type}_gpus"
    need = getattr(config, field)
    if need > total:
        raise InvalidRequestError(
            f"{field}={need} is more than the {total:g} GPUs the Ray cluster has in all; "
            "this job could never be placed"
        )


WORKERS_PER_COLOCATED_BUNDLE = int(1 / COLOCATED_GPU_FRACTION)
"""How many colocated workers one shared GPU bundle holds (one per role)."""


def check_colocated_room(num_gpus: int, holders: list[int]) -> None:
    """422 for a colocated job of ``num_gpus`` workers when a shared bundle it needs already
    holds as many workers as fit (``holders``: the worker counts of the live colocated jobs).

    Without it such a job would wait for a bundle that never frees, until job_ready_timeout.
    """
    for bundle in range(num_gpus):
        taken = sum(1 for n in holders if n > bundle)
        if taken >= WORKERS_PER_COLOCATED_BUNDLE:
            raise InvalidRequestError(
                f"colocated jobs share one set of GPU bundles, {WORKERS_PER_COLOCATED_BUNDLE} "
                f"workers to a bundle (a training, a sampling and a log-prob job); bundle "
                f"{bundle} already holds {taken} live colocated jobs' workers. Destroy one of "
                "them, or start this job with colocate=false on GPUs of its own"
            )


class Placement:
    """Placement groups for jobs; colocated jobs share a group per colocation group name
    (None: the server's default one), sized by the first of them.

    ``lock`` is the job manager's, so a shared group is never made and freed at once.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._shared: dict[str | None, tuple[Any, int]] = {}
        """Per colocation group name: its placement group and bundle count."""

    def for_job(self, job: Job) -> tuple[Any, list[float]]:
        """A placement group for ``job`` and the GPU fraction each of its workers asks for."""
        from ray.util.placement_group import placement_group

        if job.config.get("colocate"):
            with self._lock:
                need = max(
                    job.config.get("training_gpus", 0),
                    job.config.get("sampling_gpus", 0),
                    job.config.get("log_prob_gpus", 0),
                )
                name = job.colocation_group
                if name not in self._shared:
                    bundles = [{"GPU": 1.0} for _ in range(need)]
                    self._shared[name] = (placement_group(bundles, strategy="PACK"), need)
                group, size = self._shared[name]
                if need > size:
                    which = "" if name is None else f" of colocation group {name!r}"
                    raise InvalidRequestError(
                        f"colocated jobs{which} share {size} GPU bundles; this config asks "
                        f"for {need}"
                    )
                job.owns_placement_group = False
                return group, [COLOCATED_GPU_FRACTION] * job.num_gpus
        bundles = [{"GPU": 1.0} for _ in range(job.num_gpus)]
        return placement_group(bundles, strategy="PACK"), [1.0] * job.num_gpus

    def remove_shared(self, name: str | None = None, *, every: bool = False) -> None:
        """Free colocated jobs' shared group ``name`` (``every``: all of them); callers check
        that no job of it is left."""
        from ray.util.placement_group import remove_placement_group

        names = list(self._shared) if every else [name]
        for key in names:
            entry = self._shared.pop(key, None)
            if entry is None:
                continue
            try:
                remove_placement_group(entry[0])
            except Exception:
                pass


__all__ = [
    "COLOCATED_GPU_FRACTION",
    "WORKERS_PER_COLOCATED_BUNDLE",
    "Placement",
    "check_cluster_has",
    "check_colocated_room",
    "cluster_gpus",
]
