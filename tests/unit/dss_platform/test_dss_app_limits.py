"""The platform app's bounds and error mapping, in process (no Ray: no route here reaches it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from arctic_rl_dss.app import MAX_SUB_JOB_NUMBER, build_app
from arctic_rl_dss.chunks import ChunkAssembler, ChunkError, ChunkHeader, sha256
from arctic_rl_dss.service import PlatformService
from arctic_rl_dss.store import Store
from arctic_rl_dss.users import Users

TOKEN = "alice-unit-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _send(tmp_path: Path, limit: int, *requests: dict) -> list[httpx.Response]:
    users = Users.from_data({"alice": TOKEN})
    service = PlatformService(None, Store(tmp_path / "p.sqlite3"), users)
    app = build_app(service, max_body_bytes=limit)

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.request(**r) for r in requests]

    try:
        return asyncio.run(run())
    finally:
        service.close()


async def _stream(parts: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(parts):
        yield b" " * size


@pytest.mark.parametrize("path", ["/", "/job-1/step", "/job-1/generate", "/job-1/forward-backward"])
def test_a_body_over_the_limit_is_a_413_declared_or_streamed(tmp_path, path):
    declared, streamed = _send(
        tmp_path,
        1000,
        {"method": "POST", "url": path, "content": b" " * 2000, "headers": AUTH},
        {"method": "POST", "url": path, "content": _stream(5, 400), "headers": AUTH},
    )
    assert declared.status_code == 413 and "1000 bytes" in declared.json()["message"]
    assert streamed.status_code == 413, streamed.text
    assert streamed.json()["code"] == "payload_too_large"


def test_an_unparsable_body_and_an_overflowing_sub_job_are_422(tmp_path):
    body, big, edge = _send(
        tmp_path,
        10_000,
        {"method": "POST", "url": "/", "content": b"\xb3+\xd1\xa5", "headers": {
            **AUTH, "Content-Type": "application/json"}},
        {"method": "GET", "url": f"/?sub_job={2**64}", "headers": AUTH},
        {"method": "GET", "url": f"/?sub_job={MAX_SUB_JOB_NUMBER}", "headers": AUTH},
    )  # fmt: skip
    assert body.status_code == 422 and body.json()["code"] == "invalid_request"
    assert big.status_code == 422 and "sub_job" in big.json()["message"]
    assert edge.status_code == 200 and edge.json() == {"jobs": []}


def test_a_chunk_group_may_not_hold_more_than_its_frame_bytes():
    assembler = ChunkAssembler()
    data = b"x" * 100
    header = ChunkHeader(
        chunk_idx=0, total_chunks=2, chunk_group_id="g", frame_bytes=10,
        frame_sha256=sha256(b"y" * 10), chunk_sha256=sha256(data), operation="generate",
    )  # fmt: skip
    with pytest.raises(ChunkError, match="more than its frame_bytes 10"):
        assembler.add("alice", "job", header, data)
    assert assembler.pending("alice", "job", "g") is None


@pytest.mark.parametrize("given", [5, [1], "x"])
def test_a_training_config_that_is_not_an_object_is_a_422(tmp_path, given):
    sub = {"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 1, "x": 1}}
    body = {"sub_job_configs": [{**sub, "arctic_rl_config": {"training_config": given}}]}
    request = {"method": "POST", "url": "/", "json": body, "headers": AUTH}
    (answer,) = _send(tmp_path, 10_000, request)
    assert answer.status_code == 422, answer.text  # was a 500 (TypeError)
    assert "arctic_rl_config.training_config" in answer.json()["message"]
