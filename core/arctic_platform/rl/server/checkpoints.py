"""A training job's checkpoints as the server sees them: the root they live under, request
paths confined to it, the catalog of saved steps, and which checkpoint a load means.

The engine writes and reads the checkpoint directories; this module only decides paths and
keeps ``Job.checkpoints`` (step -> path) and ``Job.latest_checkpoint`` in step with them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import CheckpointNotFoundError, InvalidRequestError
from arctic_platform.rl.server.job_state import Job


def check_checkpoint_path(config: dict[str, Any]) -> None:
    """Make ``checkpoint_path`` absolute; 422 naming it when it is a file or cannot be written
    (a missing one is fine when its nearest existing parent is a writable directory)."""
    value = config.get("checkpoint_path")
    if not value or not isinstance(value, str):
        return
    path = Path(value).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise InvalidRequestError(
            f"checkpoint_path={value!r} is a file; it must be a directory: the run's checkpoint "
            "root (missing or empty: training starts from model_name and saves there)"
        )
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidRequestError(
            f"checkpoint_path={value!r} cannot be written ({existing} is not a writable "
            "directory); give a directory the server can create and write"
        )
    config["checkpoint_path"] = str(path)  # the workers' working directory is not ours


def checkpoint_root(run_dir: Path, job: Job) -> Path:
    """Where a training job's checkpoints live (created); request paths are confined to it.

    The config's ``checkpoint_path`` (the run's checkpoint root), else the run dir's
    ``checkpoints/job_<id>``."""
    given = job.config.get("checkpoint_path")
    if given:
        root = Path(str(given)).expanduser().resolve()
    else:
        root = run_dir / "checkpoints" / f"job_{job.job_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def confine(root: Path, path: str) -> Path:
    """``path`` (relative to ``root`` unless absolute) resolved; 422 when it leaves ``root``."""
    root = root.resolve()
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve()
    if resolved != root and root not in resolved.parents:
        raise InvalidRequestError(
            f"checkpoint path {path!r} is outside the job's checkpoint root {root}"
        )
    return resolved


def record_checkpoint(job: Job, step: int, path: str) -> bool:
    """Note that ``path`` holds ``job``'s checkpoint of ``step``; returns whether that is news.

    A path holds one checkpoint: saving the same tag again replaces the older step's entry.
    """
    stale = [s for s, p in job.checkpoints.items() if p == path and s != step]
    for old in stale:
        del job.checkpoints[old]
    news = bool(stale) or job.checkpoints.get(step) != path
    job.checkpoints[step] = path
    return news


def load_target(run_dir: Path, job: Job, step: int | None) -> Path:
    """The recorded checkpoint a load by ``step`` (None: the latest) means; 422 when there is
    none. A job resumed from its config's root hands the root: the engine finds the newest."""
    if step is not None:
        known = job.checkpoints.get(step)
        if known is None:
            raise InvalidRequestError(
                f"job {job.job_id} has no checkpoint at step {step}; saved "
                f"steps: {sorted(job.checkpoints)}"
            )
        return Path(known)
    if job.latest_checkpoint is not None:
        return Path(job.latest_checkpoint)
    if job.config.get("checkpoint_path"):
        return checkpoint_root(run_dir, job)
    raise InvalidRequestError(f"job {job.job_id} has no checkpoint yet")


def forget_checkpoint(
    job: Job, target: Path, step: int | None, cause: CheckpointNotFoundError
) -> CheckpointNotFoundError:
    """Drop the catalog entries of ``target``, which the engine no longer finds (deleted),
    and the error naming the steps still saved; call under ``job.lock``."""
    gone = [s for s, p in job.checkpoints.items() if p == str(target)]
    for old in gone:
        del job.checkpoints[old]
    if job.latest_checkpoint == str(target):
        newest = max(job.checkpoints, default=None)
        job.latest_checkpoint = None if newest is None else job.checkpoints[newest]
    if gone:
        job.changed()
    which = f"at step {step}" if step is not None else f"at {target} (its latest)"
    return CheckpointNotFoundError(
        f"job {job.job_id} has no checkpoint {which} any more ({cause}); saved steps: "
        f"{sorted(job.checkpoints)}"
    )


__all__ = [
    "check_checkpoint_path",
    "checkpoint_root",
    "confine",
    "forget_checkpoint",
    "load_target",
    "record_checkpoint",
]
