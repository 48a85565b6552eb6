"""dss-platform over core's own checkpoint catalog and request-id ledger (a real ``RLServer``).

No Ray: the training job's one worker is a small stand-in engine (accumulate, step, save and
load a marker directory), handed to core the way Ray would return its answers; everything
above it (core's ledger, catalog, job table, and the platform service and store) is real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from arctic_platform.rl.api import CheckpointNotFoundError as EngineCheckpointNotFound
from arctic_platform.rl.api import RLServer
from arctic_platform.rl.errors import ArcticRLError
from arctic_platform.rl.server.jobs import Job, JobState
from arctic_platform.rl.wire.frames import encode_frame
from arctic_rl_dss.chunks import encode_chunks
from arctic_rl_dss.errors import CheckpointNotFoundError, RolledBackRequestError
from arctic_rl_dss.models import LoadBody, SaveBody, StepBody
from arctic_rl_dss.service import PlatformService
from arctic_rl_dss.store import Store
from arctic_rl_dss.users import Users

USER, JOB = "alice", "j1"
BATCH = {"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]}


class Engine:
    """What a training engine answers: gradients held until a step; checkpoints as dirs."""

    def __init__(self) -> None:
        self.global_step = 0
        self.accumulated = 0

    def fwd_bwd(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.accumulated += 1
        return {"loss": 0.5}

    def step(self, *_: Any) -> dict[str, Any]:
        applied = self.accumulated > 0
        self.global_step += int(applied)
        self.accumulated = 0
        return {"global_step": self.global_step, "applied": applied}

    def save_checkpoint(self, root: str, tag: str | None) -> str:
        path = Path(root) / (tag or f"global_step{self.global_step}")
        path.mkdir(parents=True, exist_ok=True)
        (path / "marker.json").write_text(json.dumps({"global_step": self.global_step}))
        return str(path)

    def load_checkpoint(self, path: str) -> int:
        marker = Path(path) / "marker.json"
        if not marker.is_file():
            raise EngineCheckpointNotFound(f"no checkpoint at {path}: it does not exist")
        self.global_step = json.loads(marker.read_text())["global_step"]
        self.accumulated = 0
        return self.global_step


class _Remote:
    def __init__(self, function: Any) -> None:
        self.remote = function


class Worker:
    """The engine behind the two handles core uses (``call`` and ``global_step``)."""

    def __init__(self, engine: Engine) -> None:
        self.call = _Remote(lambda method, *a, **k: getattr(engine, method)(*a, **k))
        self.global_step = _Remote(lambda: engine.global_step)


@pytest.fixture
def platform(tmp_path, monkeypatch):
    rl = RLServer(tmp_path / "run")
    engine = Engine()
    job = Job(1, "training", "stand-in", {"model_name": "m"}, 1, state=JobState.RUNNING)
    job.workers = [Worker(engine)]
    job.listener = rl.jobs.persist
    rl.jobs.jobs[1] = job
    # what Ray would do: the refs are the answers themselves; the batch is not put anywhere
    monkeypatch.setattr(rl.jobs, "call", lambda job, refs, operation, timeout=None: list(refs))
    monkeypatch.setattr(rl, "_shared", lambda batch: batch)
    monkeypatch.setattr(rl, "_batch_limits", lambda job: None)
    store = Store(tmp_path / "platform.sqlite3")
    store.add_job(USER, JOB, {}, [(f"{JOB}:training:0", "training", 1, 1)])
    service = PlatformService(rl, store, Users.from_data({USER: "alice-unit-token-0123456789"}))
    yield service, job, engine
    service.close()


def _done(service: PlatformService, answer: dict[str, Any]) -> Any:
    """The result of a submitted request, once it ended (its error raised as it was)."""
    request_id = answer["request_id"]
    deadline = time.monotonic() + 30
    while True:
        view = service.get_request(USER, JOB, request_id, wait=1.0)
        if view["status"] == "done":
            return service.requests.result(request_id)
        if view["status"] in ("failed", "cancelled"):
            raise ArcticRLError(f"{view['error_code']}: {view['error']}")
        assert time.monotonic() < deadline, view


def _fwd_bwd(service: PlatformService, group: str) -> dict[str, Any]:
    frame = encode_frame({"batch": BATCH, "loss_fn": "importance_sampling"})
    (chunk,) = encode_chunks(frame, "forward-backward", group)
    return service.forward_backward(USER, JOB, chunk)


def _step(service: PlatformService, key: str) -> dict[str, Any]:
    return _done(service, service.step(USER, JOB, StepBody(idempotency_key=key)))


def test_the_checkpoint_list_is_cores_catalog_with_the_platforms_notes(platform):
    service, job, _engine = platform
    _done(service, _fwd_bwd(service, "g1"))
    _step(service, "s1")
    saved = _done(service, service.save(USER, JOB, SaveBody(checkpoint_id="first")))
    (listed,) = service.list_checkpoints(USER, JOB)["checkpoints"]
    assert job.checkpoints == {saved["path"]: 1}  # core's catalog holds the step
    assert listed["checkpoint_id"] == "first" and listed["global_steps"] == 1
    assert listed["avg_loss"] == 0.5 and listed["checkpoint_type"] == "resumable"
    assert listed["sub_job_id"] == f"{JOB}:training:0" and "path" not in listed


def test_a_deleted_checkpoint_is_gone_from_the_list_and_its_step_is_a_404_naming_saved_steps(
    platform,
):
    service, _job, engine = platform
    _done(service, service.save(USER, JOB, SaveBody(checkpoint_id="zero")))
    _done(service, _fwd_bwd(service, "g1"))
    _step(service, "s1")
    _done(service, service.save(USER, JOB, SaveBody(checkpoint_id="one")))
    service.delete_checkpoint(USER, JOB, "one")
    assert [c["checkpoint_id"] for c in service.list_checkpoints(USER, JOB)["checkpoints"]] == [
        "zero"
    ]
    with pytest.raises(CheckpointNotFoundError, match=r"at step 1; saved steps: \[0\]") as info:
        service.load(USER, JOB, LoadBody(step=1))
    assert info.value.status == 404
    with pytest.raises(CheckpointNotFoundError, match="'one'"):
        service.load(USER, JOB, LoadBody(checkpoint_id="one"))
    assert _done(service, service.load(USER, JOB, LoadBody(step=0)))["checkpoint_id"] == "zero"
    assert engine.global_step == 0


def test_a_step_key_retried_after_a_load_is_applied_again_by_cores_ledger(platform):
    service, job, engine = platform
    _done(service, service.save(USER, JOB, SaveBody(checkpoint_id="zero")))
    _done(service, _fwd_bwd(service, "g1"))
    assert _step(service, "s1")["global_step"] == 1
    assert _step(service, "s1")["replayed"] is True and engine.global_step == 1
    _done(service, service.load(USER, JOB, LoadBody(checkpoint_id="zero")))
    assert engine.global_step == 0 and job.global_step == 0
    _done(service, _fwd_bwd(service, "g2"))
    again = _step(service, "s1")  # the same key and the same request record, run again
    assert again["applied"] is True and "replayed" not in again
    assert engine.global_step == 1 and job.global_step == 1
    records = [r for r in service.store.requests(USER, JOB) if r["operation"] == "step"]
    assert len(records) == 1


def test_a_fwd_bwd_group_retried_after_a_load_is_a_409_asking_for_a_new_group(platform):
    service, _job, engine = platform
    _done(service, service.save(USER, JOB, SaveBody(checkpoint_id="zero")))
    first = _fwd_bwd(service, "g1")
    _done(service, first)
    replay = _fwd_bwd(service, "g1")  # not rolled back: the first record, nothing applied
    assert replay == {"request_id": first["request_id"], "job_id": JOB, "replayed": True}
    assert engine.accumulated == 1
    _done(service, service.load(USER, JOB, LoadBody(step=0)))
    with pytest.raises(RolledBackRequestError, match="new chunk group id") as info:
        _fwd_bwd(service, "g1")
    assert info.value.status == 409 and info.value.code == "rolled_back"
    assert "checkpoint of step 0" in str(info.value) and engine.accumulated == 0


def test_a_database_of_the_earlier_layout_opens_and_keeps_its_checkpoint_notes(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / "p.sqlite3")
    db.executescript(
        "CREATE TABLE checkpoints (owner TEXT NOT NULL, job_id TEXT NOT NULL, checkpoint_id "
        "TEXT NOT NULL, sub_job_id TEXT NOT NULL, path TEXT NOT NULL, global_steps INTEGER NOT "
        "NULL, avg_loss REAL, checkpoint_type TEXT NOT NULL, created_at REAL NOT NULL, "
        "PRIMARY KEY (owner, job_id, checkpoint_id));"
        "INSERT INTO checkpoints VALUES ('alice', 'j1', 'c', 'j1:training:0', '/r/c', 4, 0.25, "
        "'weights-only', 12.0);"
    )
    db.close()
    store = Store(tmp_path / "p.sqlite3")
    notes = store.checkpoint_notes("alice", "j1")
    assert notes == {
        "/r/c": {"avg_loss": 0.25, "checkpoint_type": "weights-only", "created_at": 12.0}
    }
    store.close()
    assert Store(tmp_path / "p.sqlite3").checkpoint_notes("alice", "j1") == notes


def test_deleting_a_checkpoint_never_removes_files_outside_the_checkpoint_root(platform, tmp_path):
    service, job, _engine = platform
    outside = tmp_path / "elsewhere" / "kept"
    outside.mkdir(parents=True)
    job.checkpoints[str(outside)] = 7  # a catalog entry outside the run dir's checkpoints
    service.delete_checkpoint(USER, JOB, "kept")
    assert outside.is_dir()
