"""A NaN (or infinite) loss in the request-id ledger survives the journal and ``serve --resume``.

A retried fwd_bwd request id answers what it answered the first time; a diverged step's loss
is NaN, and the answer after a restart must be NaN too, not ``null`` (``None``).
"""

from __future__ import annotations

import math
import time

from arctic_platform.rl.server.job_table import (
    JobTable,
    load_table,
    remember_request,
    replay_request,
    save_table,
)
from arctic_platform.rl.server.jobs import Job, JobManager, JobState

DIVERGED = {"loss": math.nan, "grad_norm": math.inf, "tokens": 5}


def _assert_diverged(answer: dict | None) -> None:
    assert answer is not None, "the request id was forgotten"
    assert isinstance(answer["loss"], float) and math.isnan(answer["loss"]), answer
    assert answer["grad_norm"] == math.inf and answer["tokens"] == 5, answer


def _job(job_id: int = 1) -> Job:
    job = Job(job_id, "training", "deepspeed", {"model_name": "m"}, 1, state=JobState.RUNNING)
    job.created_at = job.updated_at = time.time()
    return job


def test_a_nan_loss_in_the_snapshot_replays_as_nan(tmp_path):
    job = _job()
    remember_request(job.request_ids, "fb:diverged", 0, DIVERGED)
    save_table(tmp_path, JobTable(next_job_id=2, jobs=[job.record()]))
    table = load_table(tmp_path)
    assert table is not None
    back = Job.from_record(table.jobs[0])
    _assert_diverged(replay_request(back.request_ids, "fb:diverged", 1, 0))


def test_a_nan_loss_in_the_change_log_replays_as_nan_after_a_resume(tmp_path):
    manager = JobManager(tmp_path)
    job = _job()
    job.listener = manager.persist
    manager.jobs[1] = job
    manager._next_id = 2
    manager.persist()  # the snapshot, without the id
    remember_request(job.request_ids, "fb:diverged", 0, DIVERGED)
    job.changed()  # one line appended to the change log
    resumed = JobManager(tmp_path)
    resumed.load_previous(resume=False)  # what ``serve --resume`` does first
    _assert_diverged(replay_request(resumed.jobs[1].request_ids, "fb:diverged", 1, 0))
    # compacted into a fresh snapshot by the resume: still NaN when read again
    table = load_table(tmp_path)
    assert table is not None
    _assert_diverged(replay_request(table.jobs[0].request_ids, "fb:diverged", 1, 0))
