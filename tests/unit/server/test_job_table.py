"""The durable job table: atomic private writes, validation, and taking over an earlier table."""

from __future__ import annotations

import json
import stat
import time

import pytest

from arctic_platform.rl.cli import main
from arctic_platform.rl.server.job_table import (
    JobRecord,
    JobTable,
    JobTableError,
    load_table,
    save_table,
    scrub,
    state_path,
)
from arctic_platform.rl.server.jobs import JobManager, JobState


def _record(job_id: int, state: str, **extra) -> JobRecord:
    now = time.time()
    return JobRecord(
        job_id=job_id,
        job_type="training",
        engine="deepspeed",
        config={"model_name": "m", "training_gpus": 1},
        num_gpus=1,
        state=state,
        created_at=now,
        updated_at=now,
        **extra,
    )


def test_a_saved_table_loads_back_equal_and_is_private(tmp_path):
    table = JobTable(
        next_job_id=4,
        server={"port": 7001},
        jobs=[_record(1, "running", latest_checkpoint="/c/1", checkpoints={3: "/c/1"})],
    )
    path = save_table(tmp_path, table)
    assert path == state_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_table(tmp_path) == table
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_no_table_loads_as_none(tmp_path):
    assert load_table(tmp_path) is None


def test_a_corrupt_table_is_an_error_naming_the_field(tmp_path):
    state_path(tmp_path).write_text(json.dumps({"next_job_id": 0, "jobs": []}))
    with pytest.raises(JobTableError, match="next_job_id"):
        load_table(tmp_path)
    state_path(tmp_path).write_text("{not json")
    with pytest.raises(JobTableError, match="not a valid job table"):
        load_table(tmp_path)


def test_secrets_are_never_written(tmp_path):
    record = _record(1, "running")
    record.config.update({"token": "s3cret", "vllm_config": {"api_key": "k", "max_tokens": 5}})
    save_table(tmp_path, JobTable(jobs=[record]))
    text = state_path(tmp_path).read_text()
    assert "s3cret" not in text and '"k"' not in text and '"max_tokens": 5' in text
    assert scrub({"Password": 1, "max_tokens_per_mb": 2}) == {"max_tokens_per_mb": 2}


def test_a_server_without_resume_marks_unfinished_jobs_failed_and_never_reuses_ids(tmp_path):
    save_table(
        tmp_path,
        JobTable(next_job_id=5, jobs=[_record(2, "running"), _record(4, "terminated")]),
    )
    manager = JobManager(tmp_path)
    assert manager.load_previous(resume=False) == []
    assert manager.jobs[2].state is JobState.FAILED
    assert "--resume" in (manager.jobs[2].reason or "")
    assert manager.jobs[4].state is JobState.TERMINATED
    table = load_table(tmp_path)
    assert table is not None and table.next_job_id == 5
    assert {j.job_id: j.state for j in table.jobs} == {2: "failed", 4: "terminated"}


def test_serve_resume_without_a_table_says_so(tmp_path, capsys):
    assert main(["serve", "--resume", str(tmp_path)]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_serve_resume_takes_address_transport_token_and_gpus_from_the_table(tmp_path):
    from arctic_platform.rl.cli import build_parser
    from arctic_platform.rl.server.process import fill_serve_settings as _serve_settings

    server = {"host": "127.0.0.1", "port": 7123, "transport": "ray", "num_gpus": 3}
    save_table(tmp_path, JobTable(server={**server, "op_timeout": 60.0}))
    (tmp_path / "token").write_text("t")
    args = build_parser().parse_args(["serve", "--resume", str(tmp_path), "--num-gpus", "1"])
    _serve_settings(args)
    resolved = (args.host, args.port, args.transport, args.op_timeout)
    assert resolved == ("127.0.0.1", 7123, "ray", 60.0)
    assert args.num_gpus == 3  # never fewer GPUs than the resumed jobs had
    assert args.run_dir == str(tmp_path) and args.token_file == str(tmp_path / "token")
    args = build_parser().parse_args(["serve", "--resume", str(tmp_path), "--port", "7200"])
    _serve_settings(args)
    assert args.port == 7200  # an explicit option wins


# --- exact messages and edges (each kills a mutant the tests above let through) -------------


def test_a_table_goes_into_a_run_dir_that_does_not_exist_yet(tmp_path):
    run_dir = tmp_path / "runs" / "new"
    table = JobTable(next_job_id=2, jobs=[_record(1, "running")])
    assert save_table(run_dir, table).parent == run_dir
    assert load_table(run_dir) == table


def test_the_snapshot_is_sorted_json_with_one_space_indents(tmp_path):
    table = JobTable(next_job_id=2, jobs=[_record(1, "running")])
    text = save_table(tmp_path, table).read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True)


def test_an_unreadable_table_is_an_error_naming_it(tmp_path):
    state_path(tmp_path).mkdir()  # a directory where the file should be
    with pytest.raises(JobTableError) as info:
        load_table(tmp_path)
    assert str(info.value).startswith(f"cannot read the job table {state_path(tmp_path)}: ")


def test_a_log_change_that_does_not_fit_the_snapshot_names_the_log(tmp_path):
    from arctic_platform.rl.server import job_log

    save_table(tmp_path, JobTable(next_job_id=2, log_id="L", jobs=[_record(1, "running")]))
    lines = [{"log_id": "L"}, {"job_id": 1, "set": 5}]
    job_log.log_path(tmp_path).write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(JobTableError) as info:
        load_table(tmp_path)
    assert str(info.value).startswith(
        f"{job_log.log_path(tmp_path)} holds a change that does not fit "
        f"{state_path(tmp_path)}: TypeError("
    )


def test_the_journal_appends_until_the_log_is_past_its_bound_not_at_it(tmp_path):
    from arctic_platform.rl.server.job_table import JobJournal

    journal = JobJournal(tmp_path)
    record = _record(1, "running")
    journal.compact(JobTable(next_job_id=2, jobs=[record]))
    journal.limit_bytes = journal.log_bytes  # exactly at the bound: still appends
    assert journal.append(record.model_copy(update={"global_step": 1}), 2)
    journal.limit_bytes = journal.log_bytes - 1  # past it: compact instead
    assert not journal.append(record.model_copy(update={"global_step": 2}), 2)
    journal.close()
    assert load_table(tmp_path).jobs[0].global_step == 1
