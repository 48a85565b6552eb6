"""Security of the reference platform server beyond the e2e tests: bounds, pickle, isolation.

Against the real ``arctic-rl platform serve`` with alice's running job (``platform_live``):
bodies and chunks over their limits are refused with a 4xx, a pickle in a request is never
loaded, and what bob sees (capacity, job lists, errors) names nothing of alice's.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from platform_server import ALICE, BOB, LivePlatform
from support.leaks import files_holding, ray_session_logs
from support.pickles import Tripwire

from arctic_platform.rl.wire.frames import decode_frame, encode_frame
from arctic_rl_dss.app import DEFAULT_MAX_BODY_BYTES
from arctic_rl_dss.chunks import encode_chunks

pytestmark = pytest.mark.slow

OCTET = {"Content-Type": "application/octet-stream"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    else:
        yield str(value)


# --- sizes --------------------------------------------------------------------------------


def _over_limit(parts: int) -> Iterator[bytes]:
    piece = b"\0" * (DEFAULT_MAX_BODY_BYTES // parts + 1024)
    for _ in range(parts + 1):
        yield piece


@pytest.mark.parametrize("route", ["generate", "forward-backward", "step", "operation"])
def test_a_body_over_the_limit_is_a_413_declared_or_streamed(platform_live, route):
    live = platform_live
    path = f"/{live.job_id}/{route}"
    kind = OCTET if route in ("generate", "forward-backward") else {}
    with live.http() as http:
        declared = http.post(path, content=b"\0" * (DEFAULT_MAX_BODY_BYTES + 1), headers=kind)
        streamed = http.post(path, content=_over_limit(8), headers=kind)
    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text[:300]
        assert answer.json()["code"] == "payload_too_large"
    live.assert_healthy()


def _envelope(frame: bytes, **header: Any) -> bytes:
    """A one-chunk envelope of ``frame`` for generate with ``header`` fields overridden."""
    decoded = decode_frame(encode_chunks(frame, "generate", "g-bounds")[0], as_lists=False)
    key = next(k for k, v in decoded.items() if isinstance(v, dict))
    decoded[key].update(header)
    return encode_frame(decoded)


@pytest.mark.parametrize(
    ("header", "status", "words"),
    [
        ({"frame_bytes": 5 * 1024**3, "total_chunks": 2}, 422, "over the limit"),
        ({"frame_bytes": 10, "total_chunks": 2}, 422, "more than its frame_bytes"),
        ({"total_chunks": 10**6}, 422, "total_chunks"),
        ({"chunk_idx": 5, "total_chunks": 2}, 422, "chunk index 5 >= total_chunks 2"),
        ({"chunk_idx": 1, "total_chunks": 2}, 409, "from chunk 0"),
    ],
)
def test_a_chunk_outside_its_bounds_is_refused_and_nothing_runs(
    platform_live, header, status, words
):
    live = platform_live
    frame = encode_frame({"prompts": ["1 + 2 ="], "sampling_params": {"max_tokens": 2}})
    with live.http() as http:
        before = len(http.get(f"/{live.job_id}/requests").json()["requests"])
        answer = http.post(
            f"/{live.job_id}/generate", content=_envelope(frame, **header), headers=OCTET
        )
        after = len(http.get(f"/{live.job_id}/requests").json()["requests"])
    assert answer.status_code == status, answer.text
    assert words in answer.json()["message"], answer.text
    assert after == before
    live.assert_healthy()


# --- pickle -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["application/octet-stream", "application/json", "application/python-pickle"],
)
def test_a_pickle_in_a_request_is_never_loaded(platform_live, tmp_path, content_type):
    live = platform_live
    tripwire = tmp_path / "unpickled"
    body = pickle.dumps({"prompts": ["x"], "batch": Tripwire(tripwire)})
    job = live.job_id
    with live.http() as http:
        for route in ("/", f"/{job}/forward-backward", f"/{job}/generate", f"/{job}/step",
                      f"/{job}/save", f"/{job}/load", f"/{job}/operation"):  # fmt: skip
            answer = http.post(route, content=body, headers={"Content-Type": content_type})
            assert 400 <= answer.status_code < 500, (route, answer.status_code, answer.text)
            assert "message" in answer.json()
        as_b64 = base64.b64encode(body).decode()
        for operation in ("forward", "log-probs"):
            answer = http.post(
                f"/{job}/operation",
                json={"operation_type": operation, "payload": {"payload_b64": as_b64}},
            )
            assert 400 <= answer.status_code < 500, (operation, answer.text)
        chunk = encode_chunks(body, "generate", "g-pickle")[0]  # a chunked pickle
        answer = http.post(f"/{job}/generate", content=chunk, headers=OCTET)
        assert answer.status_code == 422, answer.text
    assert not tripwire.exists(), "the platform server unpickled a request body"
    live.assert_healthy()


# --- what another user sees ----------------------------------------------------------------


def _alice_secrets(live: LivePlatform) -> list[str]:
    return [
        ALICE,
        "alice",
        live.job_id,
        *live.sub_job_ids,
        *live.request_ids,
        *live.checkpoint_paths,
        str(live.run_dir),
        str(live.tokens_file),
    ]


def test_bobs_capacity_lists_and_errors_reveal_nothing_of_alice(platform_live):
    live = platform_live
    with live.http(BOB) as http:
        capacity = http.get("/capacity")
        answers = [capacity, http.get("/"), http.get("/", params={"status": "running"})]
        for number in live.sub_job_numbers:
            by_number = http.get("/", params={"sub_job": number})
            assert by_number.status_code == 200 and by_number.json() == {"jobs": []}
            answers.append(by_number)
        for path in (f"/{live.job_id}", f"/{live.job_id}/requests",
                     f"/{live.job_id}/requests/{live.request_ids[0]}",
                     f"/{live.job_id}/checkpoints"):  # fmt: skip
            answer = http.get(path)
            assert answer.status_code == 404 and answer.json()["code"].endswith("not_found")
        missing = http.get("/no-such-job-at-all")
        assert http.get(f"/{live.job_id}").json()["code"] == missing.json()["code"]
        loaded = http.post(f"/{live.job_id}/load", json={"source_job_id": "elsewhere"})
        assert loaded.status_code == 404, loaded.text
    assert capacity.json()["in_use_gpus"] == 0 and capacity.json()["has_reservation"] is False
    assert all(a.status_code == 200 for a in answers)
    listed = [j["job_id"] for a in answers[1:] for j in a.json()["jobs"]]
    assert live.job_id not in listed  # bob's own (fuzzed, cancelled) jobs only
    for answer in answers:
        text = " ".join(_strings(answer.json()))
        leaked = [s for s in _alice_secrets(live) if s in text]
        assert not leaked, (answer.request.url, leaked)


def test_no_answer_or_log_reveals_a_token_or_the_tokens_file(platform_live):
    live = platform_live
    with live.http() as http:
        paths = ("/", "/capacity", f"/{live.job_id}", f"/{live.job_id}/requests", "/openapi.json")
        mine = [http.get(p).text for p in paths]
        refused = http.get("/", headers={"Authorization": f"Bearer {ALICE[::-1]}"})
    assert refused.status_code == 401 and ALICE[::-1] not in refused.text
    assert "alice" not in refused.text and "bob" not in refused.text
    for text in [*mine, refused.text]:
        for secret in (ALICE, BOB, str(live.tokens_file)):
            assert secret not in text
    # every file a token could reach: the platform log, its run dir (job table, job logs, each
    # job's server), the client's ARCTIC_RL_HOME, Ray's session logs; not the tokens file
    root = live.run_dir.parent
    assert (root / "platform.log").is_file() and live.run_dir.is_dir()
    secrets = {"alice's token": ALICE, "bob's token": BOB, "the refused token": ALICE[::-1]}
    tokens_file = live.tokens_file.resolve()
    leaks = files_holding(secrets, [root, *ray_session_logs(live.pid)], tokens_file.__eq__)
    assert not leaks, f"a token was written to a file: {leaks}"


def test_fuzz_findings_stay_fixed(platform_live):
    live = platform_live
    job, checkpoint = live.job_id, live.checkpoint_ids[0]
    with live.http() as http:
        nul = http.get(f"/{job}/checkpoints/{checkpoint}/files/a%00b")
        assert nul.status_code == 404, nul.text  # was a 500 (embedded null byte)
        huge = http.get("/", params={"sub_job": 2**64})
        assert huge.status_code == 422 and "sub_job" in huge.json()["message"]  # was a 500
        garbled = http.post(
            f"/{job}/step", content=b"\xb3+\xd1", headers={"Content-Type": "application/json"}
        )
        assert garbled.status_code == 422, garbled.text  # was an undocumented 400
        other = http.post(f"/{job}/load", json={"source_job_id": "another"})
        assert other.status_code == 422 and "source_job_id" in other.json()["message"]
    live.assert_healthy()


def test_a_real_checkpoint_file_is_served_to_its_owner_only(platform_live):
    live = platform_live
    job, checkpoint = live.job_id, live.checkpoint_ids[0]
    with live.http() as http:
        files = http.post(f"/{job}/checkpoints/{checkpoint}:export").json()["files"]
        first = files[0]
        mine = http.get(first["url"])
    with live.http(BOB) as http:
        theirs = http.get(first["url"])
    assert mine.status_code == 200 and len(mine.content) == first["size_bytes"]
    assert theirs.status_code == 404 and theirs.json()["code"] == "job_not_found"
