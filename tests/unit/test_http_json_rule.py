"""The one JSON rule of the http and dss-platform apps and clients (``api.http_common``).

Non-finite floats are written as the bare tokens ``NaN``, ``Infinity`` and ``-Infinity`` and
read back as floats: checked on the bytes each real app answers (served by uvicorn in this
process) and on what each real client returns, over an ``OperationHandler`` whose weight
norms are non-finite.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support.servers import wait_listening

from arctic_platform.rl import api
from arctic_platform.rl.api import http_common

TOKEN = "json-rule-token-0123456789"
NORMS = (math.nan, math.inf, -math.inf)
_CONFIG = {"model_name": "m", "training_gpus": 1, "sampling_gpus": 1, "log_prob_gpus": 1}


class NonFiniteNorms:
    """An in-process ``OperationHandler``: running jobs whose weight norms are NaN, inf, -inf."""

    def __init__(self) -> None:
        self.jobs = 0

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        """Answer the few operations these tests send."""
        p = dict(payload or {})
        if name == "initialize":
            self.jobs += 1
            return {"job_id": self.jobs - 1, "state": "pending"}
        if name == "get_job":
            return {"job_id": int(p["job_id"]), "state": "running", "weight_version": 0}
        if name == "weight_norm":
            return {"norms": {str(j): v for j, v in zip(p["job_ids"], NORMS, strict=False)}}
        raise AssertionError(f"unexpected operation {name}")


def _serve(app: Any) -> Iterator[int]:
    import uvicorn

    sock = api.listening_socket("127.0.0.1", 0, 16)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_listening(port, thread)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture()
def http_port() -> Iterator[int]:
    from arctic_rl_http.app import build_app

    yield from _serve(build_app(NonFiniteNorms(), TOKEN))  # type: ignore[arg-type]


@pytest.fixture()
def dss_port(tmp_path: Path) -> Iterator[int]:
    from arctic_rl_dss.app import build_app
    from arctic_rl_dss.service import PlatformService
    from arctic_rl_dss.store import Store
    from arctic_rl_dss.users import Users

    service = PlatformService(
        NonFiniteNorms(), Store(tmp_path / "p.sqlite3"), Users.from_data({"a": TOKEN})
    )
    try:
        yield from _serve(build_app(service))
    finally:
        service.close()


def _assert_norms(norms: list[float]) -> None:
    assert math.isnan(norms[0]) and norms[1] == math.inf and norms[2] == -math.inf, norms


def test_json_bytes_writes_the_bare_tokens_and_python_reads_floats_back():
    body = http_common.json_bytes({"a": list(NORMS), "b": np.float32("nan"), "c": np.arange(2)})
    assert body == b'{"a":[NaN,Infinity,-Infinity],"b":NaN,"c":[0,1]}'
    decoded = json.loads(body)
    _assert_norms(decoded["a"])
    assert math.isnan(decoded["b"]) and decoded["c"] == [0, 1]


def test_the_http_app_answers_non_finite_floats_as_bare_tokens(http_port):
    answer = httpx.post(
        f"http://127.0.0.1:{http_port}/weight-norm",
        json={"job_ids": [0, 1, 2]},
        headers={"Authorization": f"Bearer {TOKEN}"},
        trust_env=False,
    )
    assert answer.status_code == 200, answer.text
    assert answer.content == b'{"norms":{"0":NaN,"1":Infinity,"2":-Infinity}}'


def test_the_http_client_reads_non_finite_norms_as_floats(http_port):
    from arctic_rl_http.client import HttpTransport

    with HttpTransport("127.0.0.1", http_port, TOKEN) as transport:
        norms = transport.call("weight_norm", {"job_ids": [0, 1, 2]})["norms"]
    _assert_norms([norms[k] for k in ("0", "1", "2")])


def test_the_platform_app_answers_non_finite_floats_as_bare_tokens(dss_port):
    from arctic_rl_dss.transport import DssTransport

    transport = DssTransport("127.0.0.1", dss_port, TOKEN, retries=0)
    try:
        job = transport.create_job(_CONFIG)
        subs = [s["sub_job_id"] for s in job["sub_jobs"]]
        body = {
            "operation_type": "weight-norm",
            "sub_job_id": subs[0],
            "payload": {"sub_job_ids": subs},
        }
        answer = transport.raw("POST", f"/{job['job_id']}/operation", json=body)
    finally:
        transport.close()
    assert answer.status_code == 200, answer.text
    assert b"NaN" in answer.content and b"-Infinity" in answer.content
    assert b'"nan"' not in answer.content and b'"inf"' not in answer.content
    _assert_norms(sorted(answer.json()["result"]["norms"].values(), key=_order))


def _order(value: float) -> int:
    return 0 if math.isnan(value) else (1 if value > 0 else 2)


def test_the_platform_client_reads_non_finite_norms_as_floats(dss_port):
    from arctic_rl_dss.transport import DssTransport

    transport = DssTransport("127.0.0.1", dss_port, TOKEN, retries=0)
    try:
        ids = [
            int(transport.call("initialize", {"job_type": t, "config": _CONFIG})["job_id"])
            for t in ("training", "sampling", "log_prob")
        ]
        norms = transport.call("weight_norm", {"job_ids": ids})["norms"]
    finally:
        transport.close()
    assert all(isinstance(v, float) for v in norms.values()), norms
    _assert_norms(sorted(norms.values(), key=_order))


def test_the_http_client_writes_non_finite_floats_in_a_json_body_as_bare_tokens():
    from arctic_rl_http.client import HttpTransport

    http = HttpTransport("127.0.0.1", 9, TOKEN)  # never sends: the request is only built
    try:
        request = http._request(api.BY_NAME["step"], {"job_id": 1, "learning_rate": math.inf})
    finally:
        http.close()
    assert request.read() == b'{"job_id":1,"learning_rate":Infinity}'


def test_the_platform_client_sends_a_nan_the_platform_reads_and_refuses_by_name(dss_port):
    from arctic_rl_dss.transport import DssTransport

    transport = DssTransport("127.0.0.1", dss_port, TOKEN, retries=0)
    try:
        job_id = int(
            transport.call("initialize", {"job_type": "training", "config": _CONFIG})["job_id"]
        )
        with pytest.raises(api.ServerError) as info:  # httpx's own encoder refused NaN
            transport.call("step", {"job_id": job_id, "learning_rate": math.nan})
    finally:
        transport.close()
    assert info.value.status_code == 422 and "learning_rate" in info.value.message
