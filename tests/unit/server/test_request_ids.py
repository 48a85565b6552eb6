"""Durable fwd_bwd/step request ids: kept with the job table, bounded, rolled back honestly."""

from __future__ import annotations

import time

import pytest

from arctic_platform.rl import wire
from arctic_platform.rl.server.job_table import (
    REQUEST_IDS_KEPT,
    JobRecord,
    JobTable,
    RolledBackError,
    load_table,
    remember_request,
    replay_request,
    roll_back_requests,
    save_table,
)
from arctic_platform.rl.server.jobs import Job, JobManager, JobState
from arctic_platform.rl.server.rl_server import RLServer


def test_a_remembered_id_replays_its_first_result_and_the_list_is_bounded():
    records: list = []
    remember_request(records, "fb:a", 0, {"loss": 1.5})
    assert replay_request(records, "fb:a", 1, 0) == {"loss": 1.5}
    assert replay_request(records, "fb:b", 1, 0) is None
    for i in range(REQUEST_IDS_KEPT + 5):
        remember_request(records, f"step:{i}", i, {"global_step": i + 1})
    assert len(records) == REQUEST_IDS_KEPT
    assert replay_request(records, "fb:a", 1, 0) is None  # the oldest ones are forgotten
    last = REQUEST_IDS_KEPT + 4
    assert replay_request(records, f"step:{last}", 1, last) == {"global_step": last + 1}


def test_ids_on_or_after_the_restored_step_are_rolled_back_the_older_ones_replay():
    records: list = []
    remember_request(records, "fb:s3", 3, {"loss": 2.0})  # gradients of step 4
    remember_request(records, "step:s4", 3, {"global_step": 4})
    remember_request(records, "fb:s5", 4, {"loss": 1.0})  # gradients of step 5
    remember_request(records, "step:s5", 4, {"global_step": 5})
    assert roll_back_requests(records, 4) == 2  # restored to the checkpoint at step 4
    assert replay_request(records, "step:s4", 1, 4) == {"global_step": 4}
    assert replay_request(records, "fb:s3", 1, 4) == {"loss": 2.0}
    # back on the step they first ran on: their effect is gone, so they are applied again
    assert replay_request(records, "fb:s5", 1, 4) is None
    assert replay_request(records, "step:s5", 1, 4) is None
    # a late retry that would land on other state is refused with the checkpoint step
    with pytest.raises(RolledBackError, match="restored to its checkpoint at step 4") as info:
        replay_request(records, "step:s5", 1, 6)
    assert info.value.status == 409 and info.value.code == "rolled_back"
    assert "'s5'" in str(info.value) and "job 1" in str(info.value)
    # applying it again clears the mark; a second rollback keeps the first step it named
    remember_request(records, "fb:s5", 4, {"loss": 0.9})
    assert replay_request(records, "fb:s5", 1, 9) == {"loss": 0.9}
    assert roll_back_requests(records, 2) == 3  # fb:s3, step:s4 and the new fb:s5
    assert {r.key: r.rolled_back_to for r in records}["step:s5"] == 4


def _job(job_id: int = 1) -> Job:
    return Job(job_id, "training", "deepspeed", {"model_name": "m"}, 1)


def test_request_ids_are_written_with_the_job_table_and_survive_a_server_restart(tmp_path):
    job = _job()
    remember_request(job.request_ids, "step:x", 7, {"global_step": 8, "lr": 0.1})
    roll_back_requests(job.request_ids, 8)  # nothing: step 7 is in a checkpoint at step 8
    save_table(tmp_path, JobTable(next_job_id=2, jobs=[job.record()]))
    table = load_table(tmp_path)
    assert table is not None
    record = table.jobs[0]
    assert isinstance(record, JobRecord) and record.request_ids[0].key == "step:x"
    back = Job.from_record(record)
    assert replay_request(back.request_ids, "step:x", 1, 8) == {"global_step": 8, "lr": 0.1}


def test_a_resumed_server_rolls_back_the_ids_after_the_restored_checkpoint(tmp_path):
    """What a fresh RLServer does on its first training call to a job brought back."""
    job = _job()
    remember_request(job.request_ids, "step:kept", 4, {"global_step": 5})
    remember_request(job.request_ids, "fb:lost", 6, {"loss": 1.0})
    job.state = JobState.RUNNING
    job.global_step = 6
    now = time.time()
    job.created_at = job.updated_at = now
    save_table(tmp_path, JobTable(next_job_id=2, jobs=[job.record()]))
    server = RLServer(run_dir=tmp_path)
    server.jobs.load_previous(resume=False)  # takes the table over, as start() does
    back = server.jobs.jobs[1]
    back.global_step = 5  # what the worker restored from the checkpoint at step 5 reports
    back.workers = ["a worker of the new generation"]
    assert server._replayed(back, "step:kept") == {"global_step": 5, "replayed": True}
    with pytest.raises(RolledBackError, match="checkpoint at step 5"):
        back.global_step = 9
        server._replayed(back, "fb:lost")
    table = load_table(tmp_path)
    assert table is not None
    marks = {r.key: r.rolled_back_to for r in table.jobs[0].request_ids}
    assert marks == {"step:kept": None, "fb:lost": 5}  # the rollback is in the table too
    # the same workers again: no second rollback (ids applied since are not touched)
    remember_request(back.request_ids, "fb:new", 9, {"loss": 0.5})
    assert server._replayed(back, "fb:new") == {"loss": 0.5, "replayed": True}


def test_a_job_manager_keeps_request_ids_when_it_persists(tmp_path):
    manager = JobManager(tmp_path)
    job = _job(3)
    job.listener = manager.persist
    manager.jobs[3] = job
    remember_request(job.request_ids, "fb:q", 0, {"loss": 3.0})
    job.changed()
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0].request_ids[0].result == {"loss": 3.0}


@pytest.mark.parametrize(("kind", "operation"), [("step", "step"), ("fb", "fwd_bwd")])
def test_a_rolled_back_retry_names_its_operation_id_steps_and_what_to_do(kind, operation):
    records: list = []
    remember_request(records, f"{kind}:run:7", 5, {"loss": 1.0})  # an id holding a colon
    roll_back_requests(records, 4)
    with pytest.raises(RolledBackError) as info:
        replay_request(records, f"{kind}:run:7", 3, 6)
    assert str(info.value) == (
        f"{operation} request 'run:7' of job 3 was applied on step 5, which was rolled back "
        "when the job was restored to its checkpoint at step 4; the job is at step 6 now: go "
        "on from there (a repeat of this request is applied again once the job is back on "
        "step 5)"
    )


def test_get_job_says_what_the_ledger_holds_for_a_request_id(tmp_path):
    server = RLServer(run_dir=tmp_path)
    job = _job()
    server.jobs.jobs[1] = job
    remember_request(job.request_ids, "fb:g1", 2, {"loss": 1.0})
    remember_request(job.request_ids, "step:g1", 2, {"global_step": 3})
    remember_request(job.request_ids, "fb:g0", 1, {"loss": 2.0})
    roll_back_requests(job.request_ids, 2)  # a load of the checkpoint at step 2

    def ask(request_id: str) -> dict:
        return server.get_job(wire.GetJobRequest(job_id=1, request_id=request_id))["request"]

    assert ask("g1") == {
        "request_id": "g1",
        "fwd_bwd": {"base_step": 2, "rolled_back_to": 2},
        "step": {"base_step": 2, "rolled_back_to": 2},
    }
    assert ask("g0") == {
        "request_id": "g0",
        "fwd_bwd": {"base_step": 1, "rolled_back_to": None},
        "step": None,
    }
    assert ask("never")["fwd_bwd"] is None and ask("never")["step"] is None
    assert "request" not in server.get_job(wire.GetJobRequest(job_id=1))


def test_get_job_accounts_for_a_restore_before_it_answers_for_a_request_id(tmp_path):
    server = RLServer(run_dir=tmp_path)
    job = _job()
    job.state = JobState.RUNNING
    server.jobs.jobs[1] = job
    remember_request(job.request_ids, "fb:late", 6, {"loss": 1.0})
    job.global_step = 5  # new workers (a restart) were restored to the checkpoint at step 5
    job.workers = ["a worker of the new generation"]
    held = server.get_job(wire.GetJobRequest(job_id=1, request_id="late"))["request"]
    assert held["fwd_bwd"] == {"base_step": 6, "rolled_back_to": 5}
