"""The ``http`` transport end to end: a real uvicorn server on 127.0.0.1 over a real RLServer.

The RLServer is never started, so no Ray cluster runs: health, status, metrics and get_job
answer without Ray, and every job operation fails with a real 404 or 422 from the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from arctic_platform.rl.errors import ArcticRLError, ServerError, TransportError
from arctic_platform.rl.network import is_loopback, primary_ipv4
from arctic_platform.rl.plugins import get_registry
from arctic_platform.rl.server.rl_server import RLServer
from arctic_platform.rl.testing import free_port
from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE, decode_frame, encode_frame
from arctic_platform.rl.wire.operations import OPERATIONS
from arctic_rl_http.client import HttpTransport
from arctic_rl_http.serve import serve

TOKEN = "s3cret-token"
LIMIT = 64 * 1024
RAGGED = {"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]], "advantages": [0.5, -1.0, 2.0]}


class Running:
    """A uvicorn server serving ``server`` from a background thread."""

    def __init__(self, server: RLServer, port: int, token: str | None, **kwargs: Any) -> None:
        self.server, self.port = server, port
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                serve(server, "127.0.0.1", port, token, log_level="warning", **kwargs)
            except BaseException as exc:  # surfaced by the test through self.errors
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, daemon=True, name=f"http-serve-{port}")
        self.thread.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url("/health"), timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.02)
        raise RuntimeError(f"http server on port {port} did not come up: {self.errors}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown_requested.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "serve() did not return after shutdown was requested"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    server = RLServer(run_dir=tmp_path_factory.mktemp("http-run"))
    live = Running(server, free_port(), TOKEN, max_request_bytes=LIMIT)
    yield live
    live.stop()


@pytest.fixture()
def raw(running: Running) -> Iterator[httpx.Client]:
    """A plain httpx client carrying the right token."""
    with httpx.Client(
        base_url=running.url(""), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ) as client:
        yield client


@pytest.fixture()
def transport(running: Running) -> Iterator[HttpTransport]:
    client = HttpTransport("127.0.0.1", running.port, TOKEN, timeout=10, connect_timeout=2)
    yield client
    client.close()


def _still_serving(raw: httpx.Client) -> None:
    assert raw.get("/status").status_code == 200


# --- auth ---------------------------------------------------------------------------------


def test_missing_token_is_refused_with_401_and_the_server_keeps_serving(running, raw):
    answer = httpx.get(running.url("/status"))
    assert answer.status_code == 401
    assert answer.json()["code"] == "unauthorized"
    assert "bearer" in answer.json()["message"].lower()
    _still_serving(raw)


def test_wrong_token_is_refused_on_every_operation_but_health(running, raw):
    with httpx.Client(headers={"Authorization": "Bearer wrong"}) as bad:
        for op in OPERATIONS:
            path = op.path.replace("{job_id}", "0")
            answer = bad.request(
                op.method, running.url(path), json={} if op.method != "GET" else None
            )
            expected = 200 if op.path == "/health" else 401
            assert answer.status_code == expected, (op.name, answer.text)
    _still_serving(raw)


def test_client_with_a_wrong_token_raises_server_error_saying_the_token_was_refused(running):
    with HttpTransport("127.0.0.1", running.port, "wrong") as client:
        assert client.health()  # /health is open
        with pytest.raises(ServerError) as info:
            client.call("status")
    assert info.value.status_code == 401
    assert "refused the bearer token" in info.value.message


# --- bodies and errors --------------------------------------------------------------------


def test_malformed_json_is_a_400_with_a_message(raw):
    answer = raw.post(
        "/initialize", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["message"]
    _still_serving(raw)


def test_a_json_body_that_is_not_an_object_is_a_422(raw):
    answer = raw.post("/destroy", json=[1, 2])
    assert answer.status_code == 422
    assert "object" in answer.json()["message"]


def test_a_body_missing_a_required_field_is_a_422_naming_it(transport):
    with pytest.raises(ServerError) as info:
        transport.call("initialize", {"config": {}})
    assert info.value.status_code == 422
    assert "job_type" in info.value.message
    assert info.value.code == "invalid_request"


def test_initialize_with_an_invalid_config_is_a_422_naming_the_field(transport):
    with pytest.raises(ServerError) as info:
        transport.call("initialize", {"job_type": "training", "config": {"training_gpus": 1}})
    assert info.value.status_code == 422
    assert "model_name" in info.value.message


def test_an_unsupported_content_type_is_a_415(raw):
    answer = raw.post("/destroy", content=b"job_id=1", headers={"content-type": "text/plain"})
    assert answer.status_code == 415
    assert "application/octet-stream" in answer.json()["message"]


def test_a_declared_body_over_the_limit_is_a_413(raw):
    body = b'{"job_id": 1, "pad": "' + b"x" * (LIMIT * 2) + b'"}'
    answer = raw.post("/destroy", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert answer.json()["code"] == "payload_too_large"
    assert str(LIMIT) in answer.json()["message"]
    _still_serving(raw)


def test_a_chunked_body_that_grows_past_the_limit_is_a_413(raw):
    def chunks() -> Iterator[bytes]:
        for _ in range(3 * LIMIT // 4096):
            yield b" " * 4096

    answer = raw.post("/destroy", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert "grew past" in answer.json()["message"]
    _still_serving(raw)


def test_unknown_job_is_a_404_from_the_path(transport):
    with pytest.raises(ServerError) as info:
        transport.call("get_job", {"job_id": 12345})
    assert info.value.status_code == 404
    assert info.value.code == "job_not_found"
    assert "12345" in info.value.message


def test_a_job_id_in_the_path_that_is_not_a_number_is_a_422(raw):
    answer = raw.get("/job/abc")
    assert answer.status_code == 422
    assert "job_id" in answer.json()["message"]


def test_unknown_route_is_a_404_with_a_json_message(raw):
    answer = raw.get("/no-such-operation")
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"


def test_health_status_and_metrics_answer_without_ray(transport):
    assert transport.call("health")["status"] == "ok"
    assert transport.call("status")["jobs"] == []
    before = transport.call("metrics")["requests"].get("status", 0)
    transport.call("status")
    assert transport.call("metrics")["requests"]["status"] == before + 1


# --- frames -------------------------------------------------------------------------------


def test_a_ragged_frame_reaches_the_operation_for_an_unknown_job_as_a_404(transport):
    with pytest.raises(ServerError) as info:
        transport.call("fwd_no_grad", {"job_id": 777, "batch": RAGGED})
    assert info.value.status_code == 404
    assert "777" in info.value.message


def test_a_frame_missing_batch_is_decoded_then_refused_with_422_naming_batch(raw):
    frame = encode_frame({"job_id": 1, "loss_fn": "grpo", "extra_rows": RAGGED["input_ids"]})
    answer = raw.post(
        "/fwd-bwd",
        content=frame,
        headers={"content-type": FRAME_CONTENT_TYPE, "accept": FRAME_CONTENT_TYPE},
    )
    assert answer.status_code == 422
    assert answer.headers["content-type"].startswith("application/json")  # errors are JSON
    message = answer.json()["message"]
    assert "batch" in message and "extra_rows" in message  # the decoded fields were validated


def test_a_corrupt_frame_is_a_422_and_the_server_keeps_serving(raw):
    good = encode_frame({"job_id": 1, "batch": RAGGED})
    for corrupt in (b"\x01\x02", good[:-7], b"\xff" * 8 + good[8:]):
        answer = raw.post("/fwd-bwd", content=corrupt, headers={"content-type": FRAME_CONTENT_TYPE})
        assert answer.status_code == 422, answer.text
        assert "frame" in answer.json()["message"]
    _still_serving(raw)


def test_accepting_frames_returns_the_result_as_a_frame(raw):
    answer = raw.get("/status", headers={"accept": FRAME_CONTENT_TYPE})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == FRAME_CONTENT_TYPE
    assert decode_frame(answer.content)["jobs"] == []


def test_a_ragged_frame_with_numpy_arrays_round_trips_through_the_server(raw):
    arrays = {"input_ids": [np.arange(5), np.arange(2)], "advantages": np.ones(2)}
    answer = raw.post(
        "/fwd-no-grad",
        content=encode_frame({"job_id": -1, "batch": arrays}),
        headers={"content-type": FRAME_CONTENT_TYPE},
    )
    assert answer.status_code == 422  # decoded, then job_id >= 0 was enforced
    assert "job_id" in answer.json()["message"]


# --- OpenAPI ------------------------------------------------------------------------------


def test_openapi_lists_every_operation_with_its_method_and_request_model(running):
    spec = httpx.get(running.url("/openapi.json")).json()
    for op in OPERATIONS:
        assert op.path in spec["paths"], op.path
        route = spec["paths"][op.path][op.method.lower()]
        assert route["operationId"] == op.name
        if op.method == "POST":
            content = route["requestBody"]["content"]
            ref = content["application/json"]["schema"]["$ref"]
            assert ref.endswith(f"/{op.request.__name__}")
            assert FRAME_CONTENT_TYPE in content
    schemas = spec["components"]["schemas"]
    assert "batch" in schemas["FwdBwdRequest"]["required"]
    job_param = spec["paths"]["/job/{job_id}"]["get"]["parameters"][0]
    assert job_param["name"] == "job_id" and job_param["in"] == "path"


# --- client behaviour ---------------------------------------------------------------------


def test_the_registered_http_transport_builds_this_client(running):
    spec = get_registry().get("transport", "http")
    assert spec.implemented and spec.default_port == 7000 and spec.network_address
    client = spec.create("127.0.0.1", running.port, TOKEN)
    try:
        assert isinstance(client, HttpTransport)
        assert client.call("status")["jobs"] == []
    finally:
        client.close()
    assert spec.load_server() is serve


def test_health_is_false_without_raising_when_nothing_listens():
    client = HttpTransport("127.0.0.1", free_port(), TOKEN, connect_timeout=1, retries=0)
    try:
        assert client.health() is False
        with pytest.raises(TransportError) as info:
            client.call("status")
    finally:
        client.close()
    assert f"127.0.0.1:{client.port}" in str(info.value) and "status" in str(info.value)
    assert not isinstance(info.value, ServerError)


def test_an_idempotent_call_is_retried_across_a_restart_but_initialize_is_not(tmp_path: Path):
    port = free_port()
    first = Running(RLServer(run_dir=tmp_path), port, TOKEN)
    client = HttpTransport("127.0.0.1", port, TOKEN, timeout=10, connect_timeout=1, backoff=0.3)
    try:
        assert client.call("status")["jobs"] == []
        first.stop()

        started = time.monotonic()
        with pytest.raises(TransportError, match="initialize"):
            client.call("initialize", {"job_type": "training", "config": {}})
        assert time.monotonic() - started < 0.3  # failed at once: no backoff, no retry

        second_server = RLServer(run_dir=tmp_path)
        holder: list[Running] = []
        restart = threading.Timer(0.4, lambda: holder.append(Running(second_server, port, TOKEN)))
        restart.start()
        try:
            assert client.call("status")["jobs"] == []  # retried until the new server answered
        finally:
            restart.join()
        assert "initialize" not in second_server.metrics()["requests"]
        holder[0].stop()
    finally:
        client.close()


def test_the_shutdown_operation_answers_then_serve_returns(tmp_path: Path):
    live = Running(RLServer(run_dir=tmp_path), free_port(), TOKEN)
    with HttpTransport("127.0.0.1", live.port, TOKEN, timeout=10) as client:
        assert client.call("shutdown") == {"status": "shutting down"}
        live.thread.join(timeout=10)
        assert not live.thread.is_alive()
        assert client.health() is False
    assert live.errors == []


# --- refusing to serve --------------------------------------------------------------------


def test_serve_refuses_a_wildcard_address_without_a_token(tmp_path: Path):
    with pytest.raises(ArcticRLError, match="without a token"):
        serve(RLServer(run_dir=tmp_path), "0.0.0.0", free_port(), None)


def test_serve_refuses_the_primary_address_without_a_token(tmp_path: Path):
    address = primary_ipv4()
    if is_loopback(address):
        pytest.skip("this node has no non-loopback IPv4 address")
    # serve() refuses before binding: nothing is sent to or bound on this address.
    with pytest.raises(ArcticRLError, match=f"non-loopback address {address}"):
        serve(RLServer(run_dir=tmp_path), address, 7000, None)


def test_serve_reports_an_address_in_use_as_an_error(running, tmp_path: Path):
    with pytest.raises(ArcticRLError, match=f"cannot listen on 127.0.0.1:{running.port}"):
        serve(RLServer(run_dir=tmp_path), "127.0.0.1", running.port, TOKEN)


def test_without_a_token_loopback_serves_every_route(tmp_path: Path):
    live = Running(RLServer(run_dir=tmp_path), free_port(), None)
    try:
        assert httpx.get(live.url("/status")).status_code == 200
    finally:
        live.stop()
