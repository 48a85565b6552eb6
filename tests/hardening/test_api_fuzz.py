"""Schemathesis fuzzing of the http server with three running jobs: no 5xx, no crash.

Every operation of the OpenAPI document but ``shutdown``, ``destroy`` and ``restart_job``
(which would end or restart the server and the jobs the fuzzing aims at) gets schema-valid
and schema-breaking requests, a share of them aimed at the live jobs. Afterwards the jobs
still run and still serve.
"""

from __future__ import annotations

import pytest
from fuzzing import examples_per_mode, fuzz_server

pytestmark = pytest.mark.slow

SKIP = frozenset({"shutdown", "destroy", "restart_job"})


def test_fuzzing_every_operation_gives_no_server_error_and_the_jobs_keep_serving(live):
    report = fuzz_server(
        live.base_url,
        live.token,
        examples=examples_per_mode(25),
        live_job_ids=sorted(live.job_ids.values()),
        skip=SKIP,
    )
    print(
        f"\nfuzzing: {report.requests} requests, by status {dict(sorted(report.by_status.items()))}"
        f", {len(report.by_operation)} operations, skipped {report.skipped}"
    )
    assert report.requests > 0
    assert not [s for s in report.by_status if s >= 500]
    assert set(report.by_operation) >= {"generate", "fwd_bwd", "log_probs", "step"}
    # fuzzed /initialize calls may have made jobs: destroy them, keep the three
    with live.http() as http:
        for job_id, state in live.states().items():
            if job_id not in live.job_ids.values() and state not in ("failed", "terminated"):
                assert http.post("/destroy", json={"job_id": job_id}).status_code == 200
    live.assert_healthy()
    out = live.client.generate(["1 + 2 ="], {"n": 1, "max_tokens": 4, "temperature": 0.0})
    assert len(out["outputs"][0]["completions"][0]["token_ids"]) >= 1
    assert live.client.fwd_bwd({"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]})["tokens"] > 0


def test_destroy_of_a_job_that_does_not_exist_is_a_404_and_changes_nothing(live):
    with live.http() as http:
        for job_id in (10**9, 0):
            answer = http.post("/destroy", json={"job_id": job_id})
            assert answer.status_code == 404 and "no job" in answer.json()["message"]
        assert http.post("/destroy", json={"job_id": -1}).status_code == 422
    live.assert_healthy()


def test_restart_of_a_job_that_does_not_exist_is_a_404(live):
    with live.http() as http:
        answer = http.post("/restart", params={"job_id": 10**9})
        assert answer.status_code == 404, answer.text
        assert http.post("/restart", params={"job_id": "x"}).status_code == 422
    live.assert_healthy()
