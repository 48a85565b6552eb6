"""How the http transport encodes answers and builds requests from the operations table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from arctic_platform.rl.api import http_common
from arctic_platform.rl.errors import ServerError, TransportError
from arctic_platform.rl.server.rl_server import RLServer
from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE, decode_frame
from arctic_platform.rl.wire.operations import BY_NAME, OPERATIONS
from arctic_rl_http.app import build_app
from arctic_rl_http.client import HttpTransport, _retryable


@pytest.fixture()
def transport():
    client = HttpTransport("127.0.0.1", 9, "tok")  # never sends: requests are only built
    yield client
    client.close()


def test_numpy_arrays_and_scalars_in_a_result_become_json_lists_and_numbers():
    result = {"a": np.arange(3), "b": np.float32(0.5), "c": [np.int64(2), (1, 2)], "d": None}
    assert json.loads(http_common.json_bytes(result)) == {
        "a": [0, 1, 2],
        "b": 0.5,
        "c": [2, [1, 2]],
        "d": None,
    }


def test_non_finite_metrics_survive_a_json_answer():
    decoded = json.loads(http_common.json_bytes({"loss": float("nan"), "grad_norm": float("inf")}))
    assert math.isnan(decoded["loss"]) and decoded["grad_norm"] == math.inf


def test_get_job_puts_the_job_id_in_the_path_and_sends_no_body(transport):
    request = transport._request(BY_NAME["get_job"], {"job_id": 42})
    assert request.method == "GET" and request.url.path == "/job/42"
    assert request.content == b""


def test_get_job_sends_a_ledger_request_id_as_a_query_parameter(transport):
    request = transport._request(BY_NAME["get_job"], {"job_id": 42, "request_id": "g 1"})
    assert request.url.path == "/job/42" and request.url.params["request_id"] == "g 1"
    assert not transport._request(BY_NAME["get_job"], {"job_id": 42}).url.query


def test_a_path_parameter_missing_from_the_payload_is_a_transport_error(transport):
    with pytest.raises(TransportError, match="job_id"):
        transport._request(BY_NAME["get_job"], {})


def test_frame_operations_send_and_accept_safetensors_frames(transport):
    batch = {"input_ids": [[1, 2, 3], [4]]}
    request = transport._request(BY_NAME["fwd_no_grad"], {"job_id": 1, "batch": batch})
    assert request.headers["content-type"] == FRAME_CONTENT_TYPE
    assert request.headers["accept"] == FRAME_CONTENT_TYPE
    assert request.headers["authorization"] == "Bearer tok"
    assert decode_frame(request.read()) == {"job_id": 1, "batch": batch}


def test_control_operations_send_json_with_numpy_values_listed(transport):
    request = transport._request(BY_NAME["weight_norm"], {"job_ids": np.array([1, 2])})
    assert request.headers["content-type"] == "application/json"
    assert "accept" not in request.headers or request.headers["accept"] != FRAME_CONTENT_TYPE
    assert json.loads(request.read()) == {"job_ids": [1, 2]}


def test_only_gateway_answers_are_retryable_not_the_servers_own_engine_timeout():
    assert _retryable(ServerError(503, "unavailable"))
    assert not _retryable(ServerError(504, "generate timed out", "timeout"))
    assert not _retryable(ServerError(500, "boom", "internal_error"))
    assert not _retryable(ServerError(409, "not running", "job_not_running"))


def test_the_app_has_exactly_one_route_per_operation(tmp_path):
    app = build_app(RLServer(run_dir=tmp_path), "tok")
    routes = {
        (route.path, method)
        for route in app.routes
        if getattr(route, "name", "") in BY_NAME
        for method in route.methods  # type: ignore[attr-defined]
    }
    assert routes == {(op.path, op.method) for op in OPERATIONS}


def test_build_app_refuses_a_non_positive_size_limit(tmp_path):
    with pytest.raises(ValueError, match="max_request_bytes"):
        build_app(RLServer(run_dir=tmp_path), "tok", max_request_bytes=0)


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("WeightNormRequest", {"job_ids": [True]}),
        ("JobRequest", {"job_id": False}),
        ("SyncWeightsRequest", {"training_job_id": True}),
        ("SyncWeightsRequest", {"training_job_id": 1, "sampling_job_ids": [True]}),
    ],
)
def test_a_boolean_is_never_read_as_a_job_id(model, body):
    from pydantic import ValidationError

    from arctic_platform.rl import wire

    with pytest.raises(ValidationError, match="not a boolean"):
        getattr(wire, model).model_validate(body)
