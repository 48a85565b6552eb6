"""``MemoryOps``: the sleep and wake operations of ``RLServer`` (a mixin; moved out of
``rl_server`` unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arctic_platform.rl import wire
from arctic_platform.rl.errors import JobStateError


def _memory_operation(
    verb: str, role: str, doc: str
) -> Callable[[MemoryOps, wire.SleepRequest], dict[str, Any]]:
    """The ``RLServer`` operation that runs ``verb`` (sleep or wake) on a ``role`` job's ranks."""

    def operation(self: MemoryOps, request: wire.SleepRequest) -> dict[str, Any]:
        return self._sleep_or_wake(request, role, verb)

    operation.__doc__ = doc
    return operation


class MemoryOps:
    """Memory management of colocated jobs: sleep and wake, per job type."""

    # provided by ``RLServer``
    jobs: Any
    _all_ranks: Callable[..., list[Any]]

    def _sleep_or_wake(self, request: wire.SleepRequest, role: str, method: str) -> dict[str, Any]:
        job = self.jobs.get(request.job_id)
        if job.job_type != role:
            raise JobStateError(
                f"job {job.job_id} is a {job.job_type} job; this operation is for {role}"
            )
        job = self.jobs.running(request.job_id, job.job_type)
        with job.lock:
            args = (request.level,) if method == "sleep" else ()
            results = self._all_ranks(job, method, *args)
        return {"job_id": job.job_id, "results": results}

    sleep_inference = _memory_operation("sleep", "sampling", "Sleep a sampling job.")
    wake_inference = _memory_operation("wake", "sampling", "Wake a sampling job.")
    sleep_training = _memory_operation("sleep", "training", "Offload a training job's state.")
    wake_training = _memory_operation("wake", "training", "Bring a training job's state back.")
    sleep_log_prob = _memory_operation("sleep", "log_prob", "Sleep a log-prob job.")
    wake_log_prob = _memory_operation("wake", "log_prob", "Wake a log-prob job.")


__all__ = ["MemoryOps"]
