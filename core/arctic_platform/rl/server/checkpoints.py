"""A training job's checkpoints as the server sees them: the root they live under, request
paths confined to it, the catalog of saved steps, and which checkpoint a load means.

The engine writes and reads the checkpoint directories; this module only decides paths and
keeps ``Job.checkpoints`` (path -> step, in save order: two tags saved at one step are both
kept) and ``Job.latest_checkpoint`` in step with them.
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

    A path holds one checkpoint: saving the same tag at another step replaces its older entry
    (and makes it the newest save); other paths of the same step stay listed.
    """
    if job.checkpoints.get(path) == step:
        return False
    job.checkpoints.pop(path, None)
    job.checkpoints[path] = step
    return True


def saved_steps(job: Job) -> list[int]:
    """The distinct steps the catalog holds a checkpoint of, ascending."""
    return sorted(set(job.checkpoints.values()))


def newest_path(job: Job, step: int | None = None) -> str | None:
    """The catalog's newest save of ``step`` (None: of the highest step); None when none."""
    if step is None:
        step = max(job.checkpoints.values(), default=None)
    paths = [p for p, s in job.checkpoints.items() if s == step]
    return paths[-1] if paths else None


def load_target(run_dir: Path, job: Job, step: int | None) -> Path:
    """The recorded checkpoint a load by ``step`` (None: the latest) means (of several saved
    at that step, the newest); 422 when there is none. A job resumed from its config's root
    hands the root: the engine finds the newest."""
    if step is not None:
        known = newest_path(job, step)
        if known is None:
            raise InvalidRequestError(
                f"job {job.job_id} has no checkpoint at step {step}; saved "
                f"steps: {saved_steps(job)}"
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
    """Drop the catalog entry of ``target``, which the engine no longer finds (deleted), and
    the error naming the steps still saved; call under ``job.lock``."""
    gone = job.checkpoints.pop(str(target), None) is not None
    if job.latest_checkpoint == str(target):
        job.latest_checkpoint = newest_path(job)
    if gone:
        job.changed()
    which = f"at step {step}" if step is not None else f"at {target} (its latest)"
    return CheckpointNotFoundError(
        f"job {job.job_id} has no checkpoint {which} any more ({cause}); saved steps: "
        f"{saved_steps(job)}"
    )


__all__ = [
    "check_checkpoint_path",
    "checkpoint_root",
    "confine",
    "forget_checkpoint",
    "load_target",
    "newest_path",
    "record_checkpoint",
    "saved_steps",
]
