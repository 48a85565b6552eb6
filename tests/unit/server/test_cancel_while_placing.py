"""A job destroyed while it is being placed gives back what placement got after the destroy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from arctic_platform.rl.server import jobs as jobs_module
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.jobs import JobManager


def _manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobManager, Job, list[Any]]:
    """A manager holding training job 1; the groups it releases are recorded, not freed."""
    manager = JobManager(tmp_path)
    released: list[Any] = []

    def release(job: Job) -> None:  # the real one talks to Ray
        released.append(job.placement_group)
        job.placement_group = None
        job.workers = []

    monkeypatch.setattr(manager, "_release", release)
    manager.jobs[1] = Job(1, "training", "deepspeed", {}, 1)
    return manager, manager.jobs[1], released


def _launch(manager: JobManager, job: Job, monkeypatch: pytest.MonkeyPatch, start: Any) -> None:
    """Launch ``job`` with ``start`` in place of ``start_workers`` (which places it on Ray)."""
    monkeypatch.setattr(jobs_module, "start_workers", start)
    manager._launch(job)


def test_a_group_created_after_the_destroy_is_released_when_placement_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, job, released = _manager(tmp_path, monkeypatch)

    def start_workers(job: Job, *_: Any) -> None:
        job.set_state(JobState.PLACING)
        manager.destroy(job.job_id)  # destroy arrives before the group exists: nothing to free
        job.placement_group = "the group placement created a moment later"
        # start_workers sees cancel_requested and returns, as the real one does

    _launch(manager, job, monkeypatch, start_workers)

    assert job.state is JobState.CANCELLED
    assert released[-1] == "the group placement created a moment later"
    assert job.placement_group is None


def test_a_job_that_started_keeps_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, job, released = _manager(tmp_path, monkeypatch)

    def start_workers(job: Job, *_: Any) -> None:
        job.placement_group = "its group"
        job.set_state(JobState.RUNNING)

    _launch(manager, job, monkeypatch, start_workers)

    assert released == [] and job.placement_group == "its group"
