"""A restarted training job's restored weights go to the jobs it last synced into, once it
runs again (``WeightSyncOps.resync_after_restart``), without Ray: the sync itself is faked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from arctic_platform.rl import wire
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.jobs import JobManager
from arctic_platform.rl.server.rl_server import RLServer
from arctic_platform.rl.server.weight_sync_ops import WeightSyncOps


def _job(job_id: int, job_type: str, state: JobState, synced_from: int | None = None) -> Job:
    job = Job(job_id, job_type, "engine", {"job_ready_timeout": 5}, 1, state=state)
    job.synced_from = synced_from
    job.weights_from = f"sync from training job {synced_from} (version 5)"
    return job


def _ops(tmp_path: Path, *jobs: Job) -> tuple[WeightSyncOps, list[wire.SyncWeightsRequest]]:
    manager = JobManager(tmp_path)
    for job in jobs:
        manager.jobs[job.job_id] = job
    ops = WeightSyncOps(manager, timeout=5.0, bucket_bytes=1 << 20)
    sent: list[wire.SyncWeightsRequest] = []

    def sync(request: wire.SyncWeightsRequest) -> dict[str, Any]:
        sent.append(request)
        return {"weight_version": 6, "adapter": request.adapter, "bytes": 1}

    ops.sync = sync  # type: ignore[method-assign]
    return ops, sent


def _until(check: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _restarted_trainer() -> Job:
    trainer = _job(1, "training", JobState.PENDING)
    trainer.restarts = 1
    trainer.weights_from = "checkpoint /ckpt/step-3"
    return trainer


def test_the_jobs_a_restarted_trainer_synced_into_get_its_restored_weights_once_it_runs(
    tmp_path,
):
    trainer = _restarted_trainer()
    sampler = _job(2, "sampling", JobState.RUNNING, synced_from=1)
    scorer = _job(3, "log_prob", JobState.RUNNING, synced_from=1)
    other = _job(4, "sampling", JobState.RUNNING, synced_from=9)
    ops, sent = _ops(tmp_path, trainer, sampler, scorer, other)

    ops.resync_after_restart(trainer)
    assert trainer.resync_pending == [2, 3]
    assert "stale: training job 1 restarted from checkpoint /ckpt/step-3" in sampler.weights_from
    time.sleep(0.3)
    assert sent == []  # nothing moves before the trainer runs again

    trainer.state = JobState.RUNNING
    _until(lambda: not trainer.resync_pending)
    assert [(r.training_job_id, r.sampling_job_ids, r.log_prob_job_ids) for r in sent] == [
        (1, [2], [3])
    ]
    assert sent[0].adapter is None
    assert sampler.weights_from == (
        "sync from training job 1 (version 6) after its restart from checkpoint /ckpt/step-3"
    )
    assert trainer.weights_from.endswith("restored weights synced into jobs [2, 3] as version 6")
    assert other.weights_from == "sync from training job 9 (version 5)"


def _resynced(
    tmp_path: Path, *targets: Job, trainer_ends: JobState = JobState.RUNNING
) -> tuple[Job, list[wire.SyncWeightsRequest]]:
    """A restarted trainer 1 over ``targets`` that then turns ``trainer_ends``; returns it
    once its resync is over, and the syncs sent."""
    trainer = _restarted_trainer()
    ops, sent = _ops(tmp_path, trainer, *targets)
    ops.resync_after_restart(trainer)
    trainer.state = trainer_ends
    _until(lambda: not trainer.resync_pending)
    return trainer, sent


def test_each_adapter_the_targets_last_got_is_synced_again(tmp_path):
    first = _job(2, "sampling", JobState.RUNNING, synced_from=1)
    second = _job(3, "sampling", JobState.RUNNING, synced_from=1)
    first.synced_adapter, second.synced_adapter = "default", "t2"
    _, sent = _resynced(tmp_path, first, second)
    assert sorted((r.adapter, r.sampling_job_ids[0]) for r in sent) == [("default", 2), ("t2", 3)]
    assert "adapter 't2'" in second.weights_from


def test_a_trainer_that_fails_again_sends_nothing_and_says_so(tmp_path):
    sampler = _job(2, "sampling", JobState.RUNNING, synced_from=1)
    trainer, sent = _resynced(tmp_path, sampler, trainer_ends=JobState.FAILED)
    assert sent == [] and "restored weights not sent: the job is failed" in trainer.weights_from


def test_targets_not_running_are_skipped_and_named(tmp_path):
    down = _job(2, "sampling", JobState.PENDING, synced_from=1)  # restarting itself
    trainer, sent = _resynced(tmp_path, down)
    assert sent == [] and "jobs [2] were not running" in trainer.weights_from


def test_a_trainer_nobody_synced_from_has_nothing_pending(tmp_path):
    trainer = _restarted_trainer()
    ops, sent = _ops(tmp_path, trainer, _job(2, "sampling", JobState.RUNNING))
    ops.resync_after_restart(trainer)
    assert trainer.resync_pending == [] and sent == []


@pytest.mark.parametrize(("job_type", "resynced"), [("training", True), ("sampling", False)])
def test_restart_job_resyncs_after_a_training_restart_only(tmp_path, job_type, resynced):
    server = RLServer(run_dir=tmp_path)
    job = _job(1, job_type, JobState.FAILED)
    server.jobs.jobs[1] = job
    server.jobs.restart = lambda job_id: job  # type: ignore[method-assign]
    called: list[Job] = []
    server.weight_sync.resync_after_restart = called.append  # type: ignore[method-assign]
    server.restart_job(wire.JobRequest(job_id=1))
    assert called == ([job] if resynced else [])
