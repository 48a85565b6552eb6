"""Schemathesis fuzzing of the reference platform server (``arctic-rl platform serve``).

Alice (the fuzzed user) has a running job with a training and a sampling sub-job. Every
operation of the platform's OpenAPI document but ``cancel_job`` (which would end that job;
its 404s are tested on their own) gets schema-valid and schema-breaking requests, the valid
ones aimed in part at alice's real job, sub-job, request and checkpoint ids. Any 5xx, an
accepted invalid request, a status code or body the document does not describe, and any
scheduled request that failed with a server error fail the test; afterwards the job still
runs and serves. Bob then sends valid requests at alice's ids: every answer is a 404.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from fuzzing import FuzzReport, examples_per_mode
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from platform_server import ALICE, BOB, LivePlatform

from arctic_platform.rl.wire.frames import encode_frame
from arctic_rl_dss.chunks import encode_chunks

pytestmark = pytest.mark.slow

SKIP = frozenset({"cancel_job"})
TERMINAL = ("cancelled", "failed", "terminated")
SUB_JOB_FIELDS = ("sub_job_id", "target_sub_job_id")


def _fb_frame(_: int) -> bytes:
    batch = {"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]}
    frame = encode_frame({"batch": batch})
    return encode_chunks(frame, "forward-backward", uuid.uuid4().hex)[0]


def _generate_frame(_: int) -> bytes:
    return encode_frame({"prompts": ["1 + 2 ="], "sampling_params": {"max_tokens": 2}})


CONFIG_OF = {
    "training": ("training_config", "inference_config"),
    "sampling": ("inference_config", "training_config"),
    "log_probability": ("inference_config", "training_config"),
}
"""Which config a sub-job type takes (and must not): fuzzed creates get ``n_gpus`` = 1."""
OPERATIONS = (
    "forward", "log-probs", "weight-sync", "weight-norm", "reset-prefix-cache",
    "empty-training-cache", "sleep", "wake", "cancel-request",
)  # fmt: skip
"""The operation types the platform knows: fuzzed payloads reach their handlers."""
VALID_FRAMES = {"forward_backward": _fb_frame, "generate": _generate_frame}


def _operations(base_url: str) -> list[tuple[str, Any]]:
    import schemathesis

    document = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    # the token is ours to send: without this schemathesis sends made-up bearer tokens
    document.get("components", {}).pop("securitySchemes", None)
    for methods in document["paths"].values():
        for operation in methods.values():
            operation.pop("security", None)
    schema = schemathesis.openapi.from_dict(document)
    found = []
    for result in schema.get_all_operations():
        operation = result.ok()
        found.append((operation.definition.raw.get("operationId", operation.label), operation))
    return found


def _aim(case: Any, name: str, live: LivePlatform, pick: int, always: bool) -> None:
    """Point ``case``'s ids at alice's real ones (``always``, or for most ``pick`` values)."""
    if not always and pick == 0:
        return
    params = case.path_parameters or {}
    if "job_id" in params:
        params["job_id"] = live.job_id
    if "request_id" in params:
        params["request_id"] = live.request_ids[pick % len(live.request_ids)]
    if "checkpoint_id" in params and (always or name != "delete_checkpoint"):
        params["checkpoint_id"] = live.checkpoint_ids[0]
    body = case.body
    if name in VALID_FRAMES and pick == 1:  # a well-formed frame: the data plane runs for real
        case.body = VALID_FRAMES[name](pick)
    if isinstance(body, dict) and name == "create_job":
        for sub in body.get("sub_job_configs") or []:
            if isinstance(sub, dict) and sub.get("job_type") in CONFIG_OF:
                wanted, other = CONFIG_OF[sub["job_type"]]
                given = sub.get(wanted) if wanted == "training_config" else None
                sub[wanted] = {**(given or {}), "n_gpus": 1}
                sub.pop(other, None)
    if isinstance(body, dict) and name == "operation" and pick in (1, 2):
        body["operation_type"] = OPERATIONS[(pick + len(str(body))) % len(OPERATIONS)]
    if isinstance(body, dict):
        for field in SUB_JOB_FIELDS:
            if isinstance(body.get(field), str):
                body[field] = live.sub_job_ids[pick % len(live.sub_job_ids)]
        if isinstance(body.get("checkpoint_id"), str) and name == "load":
            body["checkpoint_id"] = live.checkpoint_ids[0]


def _run(operation: Any, examples: int, mode: Any, send: Any) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 3))
    def test(case: Any, pick: int) -> None:
        send(case, pick)

    test()


def _fuzz_alice(
    live: LivePlatform, examples: int, token: str = ALICE, only: str | None = None
) -> FuzzReport:
    """Every operation (or ``only`` one) as ``token``; raises on the first failed check."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        negative_data_rejection,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    headers = {"Authorization": f"Bearer {token}"}
    report = FuzzReport()
    for name, operation in _operations(live.base_url):
        if only is not None and name != only:
            continue
        if name in SKIP:
            report.skipped.append(name)
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            def send(case: Any, pick: int, name: str = name, mode: Any = mode) -> None:
                if mode is GenerationMode.POSITIVE:
                    _aim(case, name, live, pick, always=False)
                response = case.call(base_url=live.base_url, headers=headers, timeout=120)
                report.record(name, response.status_code)
                case.validate_response(response, checks=checks, headers=headers)

            try:
                _run(operation, examples, mode, send)
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
                report.skipped.append(f"{name} (negative: nothing to break)")
    return report


def _settled(live: LivePlatform, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Alice's request records once none is pending or running (fuzzed steps and saves)."""
    deadline = time.monotonic() + timeout
    with live.http() as http:
        while True:
            records = http.get(f"/{live.job_id}/requests").json()["requests"]
            if all(r["status"] not in ("pending", "running") for r in records):
                return list(records)
            assert time.monotonic() < deadline, [r for r in records if r["status"] == "running"]
            time.sleep(1.0)


def test_fuzzing_every_platform_operation_gives_no_server_error_and_the_job_keeps_serving(
    platform_live: LivePlatform,
):
    live = platform_live
    report = _fuzz_alice(live, examples_per_mode(25))
    print(
        f"\nplatform fuzzing (alice): {report.requests} requests, by status "
        f"{dict(sorted(report.by_status.items()))}, {len(report.by_operation)} operations, "
        f"skipped {report.skipped}"
    )
    assert report.requests > 0
    assert not [s for s in report.by_status if s >= 500]
    assert {"forward_backward", "generate", "step", "save", "load", "operation"} <= set(
        report.by_operation
    )
    records = _settled(live)
    with live.http() as http:
        failed = [
            http.get(f"/{live.job_id}/requests/{r['request_id']}").json()
            for r in records
            if r["status"] == "failed"
        ]
    server_errors = [f for f in failed if (f["error_status"] or 0) >= 500]
    assert not server_errors, server_errors
    done = Counter(r["operation"] for r in records if r["status"] == "done")
    print(f"requests: {len(records)}, {len(failed)} failed (4xx), done {dict(done)}")
    assert done["forward-backward"] >= 2 and done["generate"] >= 2  # fuzzed frames ran too
    live.assert_healthy()
    with live.http() as http:  # fuzzed creates were refused (alice's reservation is full)
        assert [j["job_id"] for j in http.get("/").json()["jobs"]] == [live.job_id]
    out = live.alice.generate(["1 + 2 ="], {"n": 1, "max_tokens": 4, "temperature": 0.0})
    assert len(out["outputs"][0]["completions"][0]["token_ids"]) >= 1
    metrics = live.alice.fwd_bwd({"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]})
    assert "loss" in metrics


def test_fuzzing_with_another_users_token_at_alices_ids_is_always_a_404(
    platform_live: LivePlatform,
):
    from schemathesis.generation import GenerationMode

    live = platform_live
    before = live.job()
    headers = {"Authorization": f"Bearer {BOB}"}
    report = FuzzReport()
    wrong: list[tuple[str, str, int, str]] = []
    for name, operation in _operations(live.base_url):
        if "{job_id}" not in operation.path:
            continue

        def send(case: Any, pick: int, name: str = name) -> None:
            _aim(case, name, live, pick, always=True)
            response = case.call(base_url=live.base_url, headers=headers, timeout=60)
            report.record(name, response.status_code)
            body = response.text
            leaked = [s for s in ("alice", str(live.run_dir), *live.checkpoint_paths) if s in body]
            if response.status_code != 404 or set(response.json()) != {"message", "code"} or leaked:
                wrong.append((name, case.formatted_path, response.status_code, body[:300]))

        _run(operation, examples_per_mode(15), GenerationMode.POSITIVE, send)
    print(
        f"\nplatform fuzzing (bob at alice's ids): {report.requests} requests, by status "
        f"{dict(sorted(report.by_status.items()))}, {len(report.by_operation)} operations"
    )
    assert report.requests > 0 and "cancel_job" in report.by_operation
    assert not wrong, wrong[:10]
    live.assert_healthy()
    after = live.job()
    assert [s["sub_job_id"] for s in after["sub_jobs"]] == [
        s["sub_job_id"] for s in before["sub_jobs"]
    ]
    with live.http() as http:
        listed = http.get(f"/{live.job_id}/checkpoints").json()["checkpoints"]
    assert "fuzz-ckpt" in [c["checkpoint_id"] for c in listed]


def test_fuzzing_job_creation_as_bob_gives_no_server_error_and_leaves_alice_alone(
    platform_live: LivePlatform,
):
    """Bob has no reservation, so valid creates reach the engines (and wait for GPUs)."""
    live = platform_live
    report = _fuzz_alice(live, examples_per_mode(15), token=BOB, only="create_job")
    print(
        f"\nplatform fuzzing (bob creates): {report.requests} requests, by status "
        f"{dict(sorted(report.by_status.items()))}"
    )
    assert report.by_operation["create_job"] == report.requests > 0
    with live.http(BOB) as http:
        jobs = http.get("/").json()["jobs"]
        for job in jobs:
            answer = http.post(f"/{job['job_id']}:cancel")
            assert answer.status_code in (200, 409), answer.text  # 409: it failed on its own
        left = [j for j in http.get("/").json()["jobs"] if j["status"] not in TERMINAL]
        assert http.get("/capacity").json()["in_use_gpus"] == 0
    print(f"bob's fuzzed creates made {len(jobs)} jobs; all cancelled or failed")
    assert not left, left
    live.assert_healthy()


@pytest.mark.parametrize("token", [ALICE, BOB])
def test_cancel_of_a_job_that_is_not_yours_or_does_not_exist_is_a_404(platform_live, token):
    live = platform_live
    targets = ["no-such-job", "x" * 64, "0"] + ([live.job_id] if token == BOB else [])
    with live.http(token) as http:
        for job_id in targets:
            answer = http.post(f"/{job_id}:cancel")
            assert answer.status_code == 404, (job_id, answer.text)
            assert answer.json()["code"] == "job_not_found"
            assert live.job_id not in answer.text or job_id == live.job_id
    live.assert_healthy()


WRONG_PAYLOADS = [
    ("weight-norm", {"sub_job_ids": 5}),
    ("weight-norm", {"sub_job_ids": "abc"}),
    ("weight-norm", {"sub_job_ids": [{"a": 1}]}),
    ("weight-sync", {"target_sub_job_ids": "x"}),
    ("weight-sync", {"source_sub_job_id": {"a": 1}}),
    ("weight-sync", {"target_sub_job_ids": [5]}),
    ("sleep", {"level": "deep"}),
    ("sleep", {"level": -1}),
    ("wake", {"level": [1]}),
    ("cancel-request", {"request_id": {"a": 1}}),
    ("forward", {"payload_b64": 5}),
    ("forward", {"payload_b64": "!!"}),
    ("forward", {"batch": "rows"}),
    ("log-probs", {"prompts": 5}),
]


@pytest.mark.parametrize(("operation", "payload"), WRONG_PAYLOADS)
def test_known_operations_with_payloads_of_the_wrong_shape_are_a_4xx(
    platform_live, operation, payload
):
    live = platform_live
    with live.http() as http:
        answer = http.post(
            f"/{live.job_id}/operation", json={"operation_type": operation, "payload": payload}
        )
    assert 400 <= answer.status_code < 500, answer.text
    assert set(answer.json()) >= {"message", "code"}
