"""``CheckpointOps``: the save and load checkpoint operations of ``RLServer`` (a mixin; moved
out of ``rl_server`` unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from arctic_platform.rl import wire
from arctic_platform.rl.errors import CheckpointNotFoundError, JobStateError
from arctic_platform.rl.server.checkpoints import (
    checkpoint_root,
    confine,
    forget_checkpoint,
    load_target,
    record_checkpoint,
)
from arctic_platform.rl.server.job_state import Job
from arctic_platform.rl.server.ledger import roll_back_requests


class CheckpointOps:
    """``save_checkpoint``/``load_checkpoint`` and where a job's checkpoints live."""

    # provided by ``RLServer``
    run_dir: Path
    jobs: Any
    _settle: Callable[[Job], None]
    _all_ranks: Callable[..., list[Any]]

    def checkpoint_root(self, job: Job) -> Path:
        """Where a training job's checkpoints live (``checkpoints.checkpoint_root``)."""
        return checkpoint_root(self.run_dir, job)

    def _confined(self, job: Job, path: str) -> Path:
        return confine(self.checkpoint_root(job), path)

    def save_checkpoint(self, request: wire.SaveCheckpointRequest) -> dict[str, Any]:
        """Save full training state on every rank; returns the checkpoint path and step."""
        job = self.jobs.running(request.job_id, "training")
        if request.tag is not None:
            self._confined(job, request.tag)
        root = self.checkpoint_root(job)
        with job.lock:
            self._settle(job)
            paths = self._all_ranks(
                job, "save_checkpoint", str(root), request.tag, **request.adapter_kwargs()
            )
            step = self.jobs.call(job, [job.workers[0].global_step.remote()], "save_checkpoint")[0]
            record_checkpoint(job, int(step), str(paths[0]))
            job.latest_checkpoint = str(paths[0])
            job.global_step = int(step)
            job.changed()
            return {"path": str(paths[0]), "global_step": int(step)}

    def load_checkpoint(self, request: wire.LoadCheckpointRequest) -> dict[str, Any]:
        """Load by path, by step, or the latest checkpoint; returns the restored global step."""
        # The recorded path goes to the training engine, whose discovery resolves it (a save cut
        # short between its renames leaves the complete copy hidden); the table then keeps the
        # step the engine restored for that path.
        job = self.jobs.running(request.job_id, "training")
        explicit = self._confined(job, request.path) if request.path is not None else None
        with job.lock:
            self._settle(job)  # a restart's restore first: it may correct the saved steps
            if explicit is not None:
                target = explicit
            else:
                target = load_target(self.run_dir, job, request.step)
            try:
                options = request.adapter_kwargs()
                if not request.optimizer:  # only when asked: engines before it lack the keyword
                    options["optimizer"] = False
                steps = self._all_ranks(job, "load_checkpoint", str(target), **options)
            except CheckpointNotFoundError as exc:
                if explicit is not None:
                    raise
                raise forget_checkpoint(job, target, request.step, exc) from None
            restored = int(steps[0])
            job.global_step = restored
            if explicit is None:  # a recorded checkpoint: keep what the engine found there
                record_checkpoint(job, restored, str(target))
            roll_back_requests(job.request_ids, restored)
            job.changed()
            if request.step is not None and explicit is None and restored != request.step:
                raise JobStateError(
                    f"the checkpoint of step {request.step} at {target} was being replaced by a "
                    f"save of step {restored} that was cut short; the engine found that "
                    f"complete copy and job {job.job_id} is at step {restored} now"
                )
            return {"global_step": restored, "path": str(target)}


__all__ = ["CheckpointOps"]
