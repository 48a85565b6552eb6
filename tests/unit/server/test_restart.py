"""``restart_job``: which jobs may restart, and ``POST /restart?job_id=`` reaching the server."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from arctic_platform.rl.errors import JobNotFoundError, JobStateError
from arctic_platform.rl.server.job_table import JobRecord, JobTable, save_table
from arctic_platform.rl.server.rl_server import RLServer
from arctic_rl_http.app import build_app


def _server_with(tmp_path, state: str) -> RLServer:
    now = time.time()
    record = JobRecord(
        job_id=3,
        job_type="sampling",
        engine="vllm",
        config={"model_name": "m"},
        num_gpus=1,
        state=state,
        reason="destroyed",
        created_at=now,
        updated_at=now,
    )
    save_table(tmp_path, JobTable(next_job_id=4, jobs=[record]))
    server = RLServer(run_dir=tmp_path)
    server.jobs.load_previous(resume=False)  # what start() does, without Ray
    return server


def test_a_destroyed_job_cannot_be_restarted(tmp_path):
    server = _server_with(tmp_path, "terminated")
    with pytest.raises(JobStateError, match="cannot be restarted, create a new job"):
        server.jobs.restart(3)
    with pytest.raises(JobNotFoundError, match="no job with id 9"):
        server.jobs.restart(9)


def test_restart_takes_the_job_id_as_a_query_parameter(tmp_path):
    client = TestClient(build_app(_server_with(tmp_path, "terminated"), "tok"))
    headers = {"Authorization": "Bearer tok"}
    answer = client.post("/restart?job_id=3", headers=headers)
    assert answer.status_code == 409 and "job 3 was terminated" in answer.json()["message"]
    answer = client.post("/restart?job_id=8", headers=headers)
    assert answer.status_code == 404 and "no job with id 8" in answer.json()["message"]
    answer = client.post("/restart", headers=headers, json={"job_id": 3})
    assert answer.status_code == 409
    assert client.post("/restart?job_id=x", headers=headers).status_code == 422
