"""The job table's change log: appends replay over the snapshot, a torn tail is ignored, the log
is compacted, and an append costs the size of one change, not of the table."""

from __future__ import annotations

import json
import random
import stat
import time

import pytest

from arctic_platform.rl.server.job_log import LOG_FILE, log_path
from arctic_platform.rl.server.job_table import (
    JobJournal,
    JobRecord,
    JobTable,
    JobTableError,
    load_table,
    remember_request,
    roll_back_requests,
    state_path,
)
from arctic_platform.rl.server.jobs import Job, JobManager, JobState


def _manager_with_job(tmp_path, job_id: int = 1) -> tuple[JobManager, Job]:
    manager = JobManager(tmp_path)
    job = Job(job_id, "training", "deepspeed", {"model_name": "m"}, 1, state=JobState.RUNNING)
    job.listener = manager.persist
    manager.jobs[job_id] = job
    manager._next_id = job_id + 1
    manager.persist()  # what create() does: the job is in the snapshot
    return manager, job


def _train(job: Job, steps: int, start: int = 0) -> None:
    """What RLServer does per fwd_bwd and step with request ids."""
    for i in range(start, start + steps):
        remember_request(job.request_ids, f"fb:{i}", job.global_step, {"loss": float(i)})
        job.changed()
        job.global_step += 1
        remember_request(job.request_ids, f"step:{i}", i, {"global_step": job.global_step})
        job.changed()


def _record(job_id: int, **extra) -> JobRecord:
    now = time.time()
    return JobRecord(
        job_id=job_id,
        job_type="training",
        engine="deepspeed",
        config={"model_name": "m"},
        num_gpus=1,
        state="running",
        created_at=now,
        updated_at=now,
        **extra,
    )


def test_a_change_is_appended_to_the_log_and_leaves_the_snapshot_alone(tmp_path):
    _, job = _manager_with_job(tmp_path)
    snapshot = state_path(tmp_path).read_bytes()
    _train(job, 3)
    assert state_path(tmp_path).read_bytes() == snapshot
    lines = log_path(tmp_path).read_text().splitlines()
    assert len(lines) == 1 + 6  # the header, then one line per change
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0] == job.record()
    assert table.jobs[0].global_step == 3


def test_an_unchanged_job_appends_nothing(tmp_path):
    _, job = _manager_with_job(tmp_path)
    _train(job, 1)
    size = log_path(tmp_path).stat().st_size
    job.changed()
    assert log_path(tmp_path).stat().st_size == size


def test_the_log_is_private_and_holds_no_secret(tmp_path):
    journal = JobJournal(tmp_path)
    journal.compact(JobTable())
    record = _record(1)
    record.config.update({"token": "s3cret", "vllm_config": {"api_key": "k2", "n": 5}})
    assert journal.append(record, next_job_id=2)
    assert stat.S_IMODE(log_path(tmp_path).stat().st_mode) == 0o600
    text = log_path(tmp_path).read_text()
    assert "s3cret" not in text and "k2" not in text and '"n":5' in text
    table = load_table(tmp_path)
    assert table is not None and table.next_job_id == 2 and table.jobs[0].job_id == 1


def test_a_line_torn_by_a_crash_is_ignored(tmp_path):
    _, job = _manager_with_job(tmp_path)
    _train(job, 2)
    expected = job.record()
    with log_path(tmp_path).open("ab") as f:  # a crash in the middle of the next append
        f.write(b'{"job_id":1,"set":{"global_step":')
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0] == expected


def test_a_garbled_last_line_is_ignored_but_a_garbled_earlier_one_is_an_error(tmp_path):
    _, job = _manager_with_job(tmp_path)
    _train(job, 2)
    expected = job.record()
    clean = log_path(tmp_path).read_bytes()
    log_path(tmp_path).write_bytes(clean + b"\x00\x00\x00\n")
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0] == expected
    lines = clean.split(b"\n")
    lines[2] = b"{garbled"
    log_path(tmp_path).write_bytes(b"\n".join(lines))
    with pytest.raises(JobTableError, match=f"line 3 of .*{LOG_FILE}"):
        load_table(tmp_path)


def test_a_resumed_manager_takes_the_replayed_table_and_starts_a_fresh_log(tmp_path):
    _, job = _manager_with_job(tmp_path)
    _train(job, 4)
    with log_path(tmp_path).open("ab") as f:
        f.write(b'{"job_id":1,"se')  # the crash
    manager = JobManager(tmp_path)
    manager.load_previous(resume=False)
    back = manager.jobs[1]
    assert back.global_step == 4 and back.request_ids == job.request_ids
    assert len(log_path(tmp_path).read_text().splitlines()) == 1  # compacted: header only
    _train(back, 1, start=4)
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0].global_step == 5


def test_the_log_is_compacted_into_the_snapshot_once_past_its_bound(tmp_path):
    manager, job = _manager_with_job(tmp_path)
    manager._journal.limit_bytes = 2000
    _train(job, 20)
    assert manager._journal.log_bytes <= 2000 + 1000  # one line past the bound at most
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0] == job.record()
    on_disk = json.loads(state_path(tmp_path).read_text())
    assert on_disk["jobs"][0]["global_step"] > 0  # earlier changes were folded in


def test_a_clean_stop_folds_the_log_into_the_snapshot(tmp_path):
    manager, job = _manager_with_job(tmp_path)
    _train(job, 3)
    manager.stop_all()
    assert len(log_path(tmp_path).read_text().splitlines()) == 1
    assert json.loads(state_path(tmp_path).read_text())["jobs"][0]["global_step"] == 3
    job.global_step = 99
    job.changed()  # after the stop the table keeps the jobs as they were
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0].global_step == 3


def test_a_log_left_by_a_crash_during_compaction_is_not_replayed(tmp_path):
    _, job = _manager_with_job(tmp_path)
    _train(job, 2)
    stale = log_path(tmp_path).read_bytes()
    manager = JobManager(tmp_path)
    manager.load_previous(resume=False)  # compacts: a new snapshot with a new log id
    manager.jobs[1].global_step = 0
    manager.persist()
    log_path(tmp_path).write_bytes(stale)  # as if the crash came before the old log went
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0].global_step == 0


def test_replay_rebuilds_the_request_id_ledger_exactly(tmp_path):
    _, job = _manager_with_job(tmp_path)
    rng = random.Random(0)
    for _ in range(400):
        action = rng.random()
        if action < 0.7:
            key = f"fb:{rng.randrange(200)}"  # repeats move a key to the end
            remember_request(job.request_ids, key, job.global_step, {"loss": rng.random()})
        elif action < 0.9:
            job.global_step += 1
        else:
            roll_back_requests(job.request_ids, max(0, job.global_step - rng.randrange(4)))
        job.changed()
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0].request_ids == job.request_ids


def test_an_append_costs_the_same_bytes_whatever_the_size_of_the_table(tmp_path):
    def bytes_of_one_step(run_dir, jobs: int) -> int:
        journal = JobJournal(run_dir)
        records = []
        for job_id in range(1, jobs + 1):
            record = _record(job_id, global_step=7)
            for i in range(128):
                remember_request(record.request_ids, f"fb:{i}", 7, {"loss": 0.5})
            records.append(record)
        journal.compact(JobTable(next_job_id=jobs + 1, jobs=records))
        target = records[0].model_copy(deep=True)
        target.global_step = 8
        remember_request(target.request_ids, "step:x", 7, {"global_step": 8})
        before = journal.log_bytes
        assert journal.append(target, next_job_id=jobs + 1)
        return journal.log_bytes - before

    small = bytes_of_one_step(tmp_path / "one", 1)
    large = bytes_of_one_step(tmp_path / "many", 300)
    assert small == large
    assert small < 300  # a line: the new step and one ledger entry in, one out
    assert state_path(tmp_path / "many").stat().st_size > 100 * small


def test_a_failed_append_is_followed_by_a_compaction_not_by_a_line_after_half_a_line(
    tmp_path, monkeypatch
):
    import errno
    import os

    from arctic_platform.rl.server import job_log

    _, job = _manager_with_job(tmp_path)
    _train(job, 1)
    real_write = os.write
    calls = []

    def disk_fills_up(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(job_log.os, "write", disk_fills_up)
    _train(job, 1, start=1)  # persist logs the error and never raises
    monkeypatch.setattr(job_log.os, "write", real_write)
    _train(job, 1, start=2)
    table = load_table(tmp_path)
    assert table is not None and table.jobs[0] == job.record()


# --- the log's own functions, exactly (each kills mutants the tests above let through) -------


def test_apply_keeps_the_larger_next_job_id_and_starts_from_one():
    from arctic_platform.rl.server.job_log import apply

    table: dict = {}
    apply(table, {"next_job_id": 1})
    assert table == {"next_job_id": 1}
    table = {"next_job_id": 5}
    apply(table, {"next_job_id": 3})
    assert table == {"next_job_id": 5}


def test_apply_new_replaces_only_the_job_with_that_id():
    from arctic_platform.rl.server.job_log import apply

    table: dict = {}
    apply(table, {"job_id": 1, "new": {"job_id": 1, "state": "a"}})
    assert table == {"jobs": [{"job_id": 1, "state": "a"}]}
    table = {"jobs": [{"job_id": 1, "state": "a"}, {"job_id": 2, "state": "b"}]}
    apply(table, {"job_id": 1, "new": {"job_id": 1, "state": "c"}})
    assert table["jobs"] == [{"job_id": 2, "state": "b"}, {"job_id": 1, "state": "c"}]


def test_apply_puts_ledger_records_in_place_and_needs_the_job():
    from arctic_platform.rl.server.job_log import JobLogError, apply

    table = {"jobs": [{"job_id": 1, "state": "a"}]}  # no request_ids yet
    apply(table, {"job_id": 1, "ids": {"put": [{"key": "x", "v": 1}, {"key": "y", "v": 1}]}})
    apply(table, {"job_id": 1, "ids": {"put": [{"key": "x", "v": 2}]}})
    assert table["jobs"][0]["request_ids"] == [{"key": "x", "v": 2}, {"key": "y", "v": 1}]
    with pytest.raises(JobLogError) as info:
        apply(table, {"job_id": 9, "set": {"state": "b"}})
    assert str(info.value) == "a change of job 9, which the table does not hold"


def test_a_change_of_records_without_ledgers_is_just_the_fields():
    from arctic_platform.rl.server.job_log import change

    old, new = {"job_id": 1, "state": "a"}, {"job_id": 1, "state": "b"}
    assert change(old, new) == {"job_id": 1, "set": {"state": "b"}}


def test_a_bad_line_before_the_last_names_itself(tmp_path):
    from arctic_platform.rl.server.job_log import JobLogError, read_log

    log_path(tmp_path).write_text('{"log_id": "L"}\n[1, 2]\n{"job_id": 1}\n')
    with pytest.raises(JobLogError) as info:
        read_log(tmp_path, "L")
    assert str(info.value) == f"line 2 of {log_path(tmp_path)} is not a change: not a JSON object"


def test_a_log_holding_only_a_torn_line_has_no_entries(tmp_path):
    from arctic_platform.rl.server.job_log import read_log

    log_path(tmp_path).write_text('{"log_id": "L"')
    assert read_log(tmp_path, "L") == []


def test_a_new_writer_truncates_and_counts_every_byte_of_sorted_lines(tmp_path, monkeypatch):
    import os

    from arctic_platform.rl.server.job_log import LogWriter

    log_path(tmp_path).write_text("x" * 500 + "\n")
    writer = LogWriter(tmp_path, "L2")
    writer.append({"b": 1, "a": 2})
    data = log_path(tmp_path).read_bytes()
    assert data == b'{"log_id":"L2"}\n{"a":2,"b":1}\n'
    assert writer.size == len(data)
    writer.close()
    closed: list[int] = []
    monkeypatch.setattr(os, "close", closed.append)
    writer.close()  # a second close closes nothing
    assert closed == []


class _Method:
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self) -> None:
        self.calls.append(self.name)
        raise AssertionError(f"{self.name} of a worker that never started")


class _NeverPlaced:
    """A worker handle whose actor never started: any call would wait for it."""

    def __init__(self, calls: list[str]) -> None:
        self.close = _Method(calls, "close")


def test_a_stop_does_not_wait_on_workers_of_a_job_that_never_ran(tmp_path):
    manager, job = _manager_with_job(tmp_path)
    job.state = JobState.INITIALIZING
    calls: list[str] = []
    job.workers = [_NeverPlaced(calls)]
    manager.stop_all()
    assert calls == [] and job.workers == []  # killed, not closed
