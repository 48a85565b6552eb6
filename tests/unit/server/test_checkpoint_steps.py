"""Load by step / latest after a save cut short: the engine's discovery decides, the table follows.

The training engine is stood in for by what its ``load_checkpoint`` does first: the plugin's
real ``ds_checkpoint`` discovery on the real directories a cut publish leaves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arctic_platform.rl import wire
from arctic_platform.rl.errors import CheckpointNotFoundError, InvalidRequestError, JobStateError
from arctic_platform.rl.server.checkpoints import record_checkpoint
from arctic_platform.rl.server.job_table import load_table
from arctic_platform.rl.server.jobs import Job, JobManager, JobState
from arctic_platform.rl.server.rl_server import RLServer
from arctic_rl_engines import ds_checkpoint
from arctic_rl_engines.ds_model import CHECKPOINT_MARKER


def _complete(path: Path, step: int) -> str:
    path.mkdir(parents=True)
    (path / CHECKPOINT_MARKER).write_text(json.dumps({"global_step": step}))
    return str(path)


def _server(tmp_path, monkeypatch) -> tuple[RLServer, Job, Path]:
    server = RLServer(run_dir=tmp_path)
    job = Job(1, "training", "deepspeed", {"model_name": "m"}, 1, state=JobState.RUNNING)
    job.listener = server.jobs.persist
    job.workers = ["the workers"]
    server.jobs.jobs[1] = job
    loaded: list[str] = []

    def engine_load(job: Job, method: str, path: str) -> list[int]:
        assert method == "load_checkpoint"
        loaded.append(path)
        found = ds_checkpoint.find_checkpoint(path)
        return [int(ds_checkpoint.read_marker(found)["global_step"])]

    monkeypatch.setattr(server, "_all_ranks", engine_load)
    root = server.checkpoint_root(job)
    job.checkpoints = {_complete(root / "global_step3", 3): 3, _complete(root / "latest", 5): 5}
    job.latest_checkpoint = str(root / "latest")
    return server, job, root


def _cut_replacement(root: Path, step: int) -> None:
    """A save of ``latest`` at ``step`` killed between the two renames of its publish."""
    (root / "latest").rename(root / ".latest.old")
    _complete(root / ".latest.tmp", step)


def _load(server: RLServer, **fields) -> dict:
    return server.load_checkpoint(wire.LoadCheckpointRequest(job_id=1, **fields))


def test_latest_resolves_the_complete_hidden_copy_and_the_table_keeps_its_step(
    tmp_path, monkeypatch
):
    server, job, root = _server(tmp_path, monkeypatch)
    _cut_replacement(root, 9)
    assert _load(server) == {"global_step": 9, "path": str(root / "latest")}
    assert job.global_step == 9
    assert job.checkpoints == {str(root / "global_step3"): 3, str(root / "latest"): 9}
    table = load_table(tmp_path)
    assert table is not None and sorted(table.jobs[0].checkpoints.values()) == [3, 9]
    assert _load(server, step=9)["global_step"] == 9
    assert _load(server, step=3)["global_step"] == 3  # a visible checkpoint, as before
    saved = r"no checkpoint at step 5; saved steps: \[3, 9\]"
    with pytest.raises(InvalidRequestError, match=saved):
        _load(server, step=5)


def test_a_step_whose_copy_was_being_replaced_says_which_step_the_job_is_at(tmp_path, monkeypatch):
    server, job, root = _server(tmp_path, monkeypatch)
    _cut_replacement(root, 9)
    with pytest.raises(JobStateError, match=r"cut short.*job 1 is at step 9 now"):
        _load(server, step=5)
    assert job.global_step == 9 and 5 not in job.checkpoints.values()


def test_a_resumed_job_corrects_the_step_of_the_checkpoint_it_was_restored_from(
    tmp_path, monkeypatch
):
    server, job, root = _server(tmp_path, monkeypatch)
    _cut_replacement(root, 9)
    # serve --resume: the job came back from its latest checkpoint; the engine reported 9
    job.launch_overrides = {"checkpoint_path": job.latest_checkpoint}
    job.global_step = 9
    job.workers = ["a new generation of workers"]
    with pytest.raises(InvalidRequestError, match=r"saved steps: \[3, 9\]"):
        _load(server, step=5)  # refused before anything is loaded: nothing changed
    assert job.global_step == 9


def test_saving_a_tag_again_replaces_the_older_steps_entry():
    job = Job(1, "training", "deepspeed", {}, 1)
    assert record_checkpoint(job, 5, "/c/latest") is True
    assert record_checkpoint(job, 5, "/c/latest") is False
    record_checkpoint(job, 7, "/c/global_step7")
    assert record_checkpoint(job, 9, "/c/latest") is True
    assert job.checkpoints == {"/c/global_step7": 7, "/c/latest": 9}


def test_two_tags_saved_at_one_step_are_both_kept_and_a_load_by_step_takes_the_newest(
    tmp_path, monkeypatch
):
    server, job, root = _server(tmp_path, monkeypatch)
    record_checkpoint(job, 5, _complete(root / "before-eval", 5))  # a second save at step 5
    view = job.describe()["checkpoints"]
    assert view == [
        {"step": 3, "path": str(root / "global_step3")},
        {"step": 5, "path": str(root / "latest")},
        {"step": 5, "path": str(root / "before-eval")},
    ]
    assert _load(server, step=5)["path"] == str(root / "before-eval")
    shutil.rmtree(root / "before-eval")
    with pytest.raises(CheckpointNotFoundError, match=r"saved steps: \[3, 5\]"):
        _load(server, step=5)
    assert _load(server, step=5)["path"] == str(root / "latest")


def test_a_table_written_with_the_step_keyed_catalog_still_loads():
    from arctic_platform.rl.server.job_table import JobRecord

    old = {"1": "/c/global_step1", "4": "/c/latest"}
    record = JobRecord.model_validate(
        {"job_id": 1, "job_type": "training", "engine": "deepspeed", "config": {},
         "num_gpus": 1, "state": "running", "checkpoints": old,
         "created_at": 0.0, "updated_at": 0.0}
    )  # fmt: skip
    assert record.checkpoints == {"/c/global_step1": 1, "/c/latest": 4}


def test_a_restart_hands_the_engine_a_latest_checkpoint_it_cannot_see_itself(tmp_path):
    manager = JobManager(tmp_path)
    job = Job(1, "training", "deepspeed", {}, 1, latest_checkpoint=str(tmp_path / "latest"))
    assert manager._restore_source(job) == {"checkpoint_path": str(tmp_path / "latest")}
    job = Job(2, "training", "deepspeed", {}, 1, global_step=4)
    assert manager._restore_source(job) == {} and job.global_step == 0


def test_the_public_view_lists_the_catalog_entries_whose_directory_exists(tmp_path, monkeypatch):
    server, job, root = _server(tmp_path, monkeypatch)
    view = server.get_job(wire.GetJobRequest(job_id=1))
    assert view["checkpoints"] == [
        {"step": 3, "path": str(root / "global_step3")},
        {"step": 5, "path": str(root / "latest")},
    ]
    shutil.rmtree(root / "global_step3")  # deleted outside the server (the platform does)
    assert job.describe()["checkpoints"] == [{"step": 5, "path": str(root / "latest")}]


def test_a_load_by_step_of_a_deleted_checkpoint_is_a_404_naming_the_saved_steps(
    tmp_path, monkeypatch
):
    server, job, root = _server(tmp_path, monkeypatch)
    shutil.rmtree(root / "global_step3")
    with pytest.raises(CheckpointNotFoundError, match=r"step 3 any more.*saved steps: \[5\]"):
        _load(server, step=3)
    assert job.checkpoints == {str(root / "latest"): 5}  # the entry is dropped for good
    table = load_table(tmp_path)
    assert table is not None and list(table.jobs[0].checkpoints.values()) == [5]
    with pytest.raises(InvalidRequestError, match=r"no checkpoint at step 3; saved steps: \[5\]"):
        _load(server, step=3)


def test_a_deleted_latest_checkpoint_gives_way_to_the_newest_saved_one(tmp_path, monkeypatch):
    server, job, root = _server(tmp_path, monkeypatch)
    shutil.rmtree(root / "latest")
    with pytest.raises(CheckpointNotFoundError, match=r"its latest.*saved steps: \[3\]"):
        _load(server)
    assert job.latest_checkpoint == str(root / "global_step3")
    assert _load(server) == {"global_step": 3, "path": str(root / "global_step3")}
