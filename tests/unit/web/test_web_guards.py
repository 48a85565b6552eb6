"""The web kit's guards: a token (bearer or key header) and a body-size limit, as ASGI layers;
and the front-ends on them keep their answers (the http app checks its bearer token per route,
so an unknown route stays a 404; the tinker app refuses a key or a size in Tinker's form)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arctic_platform.rl import api, http_common
from arctic_platform.rl.errors import ArcticRLError, AuthError
from arctic_platform.rl.server.rl_server import RLServer
from arctic_platform.rl.web import common
from arctic_platform.rl.web.guards import (
    BodyLimit,
    GuardLayer,
    TokenGuard,
    bearer_token,
)
from arctic_platform.rl.web.openapi import install_openapi
from arctic_rl_http.app import build_app as http_app
from arctic_rl_tinker import app as tinker

TOKEN = "s3cret-token-0123"
LIMIT = 1000
FRONT_TOKEN = "tml-front-end-guard-token"


async def _echo(request: Request) -> Response:
    return JSONResponse({"received": len(await request.body())})


def _app(*layers: tuple[type, dict[str, Any]]) -> Starlette:
    app = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/open", _echo)])
    for layer, options in layers:
        app.add_middleware(layer, **options)
    return app


def _send(app: Any, *requests: dict[str, Any]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.request(**r) for r in requests]

    return asyncio.run(run())


async def _chunks(parts: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(parts):
        yield b" " * size


def test_a_missing_or_wrong_bearer_token_is_a_401_and_the_right_one_passes():
    app = _app((GuardLayer, {"guard": TokenGuard(TOKEN, open_paths={"/open"})}))
    missing, wrong, right, open_ = _send(
        app,
        {"method": "POST", "url": "/echo"},
        {"method": "POST", "url": "/echo", "headers": {"Authorization": "Bearer nope"}},
        {"method": "POST", "url": "/echo", "headers": {"Authorization": f"Bearer {TOKEN}"}},
        {"method": "GET", "url": "/open"},
    )
    assert (missing.status_code, missing.json()["code"]) == (401, "unauthorized")
    assert "missing bearer token" in missing.json()["message"]
    assert wrong.status_code == 401 and "refused" in wrong.json()["message"]
    assert TOKEN not in wrong.text and "nope" not in wrong.text
    assert (right.status_code, open_.status_code) == (200, 200)


def test_a_key_header_guard_reads_the_header_itself_and_answers_in_the_apps_own_form():
    guard = TokenGuard(TOKEN, header="X-API-Key", missing="no key", refused="bad key")

    def respond(exc: ArcticRLError) -> Response:
        return JSONResponse({"error": str(exc)}, exc.status)

    app = _app((GuardLayer, {"guard": guard, "respond": respond}))
    missing, wrong, right = _send(
        app,
        {"method": "POST", "url": "/echo"},
        {"method": "POST", "url": "/echo", "headers": {"x-api-key": "nope"}},
        {"method": "POST", "url": "/echo", "headers": {"x-api-key": TOKEN}},
    )
    assert (missing.status_code, missing.json()) == (401, {"error": "no key"})
    assert (wrong.status_code, wrong.json()) == (401, {"error": "bad key"})
    assert right.status_code == 200


def test_no_token_lets_every_request_through():
    TokenGuard(None).check({}, "/anything")


def test_bearer_token_reads_the_scheme_case_blind_and_refuses_anything_else():
    assert bearer_token(f"bearer  {TOKEN} ") == TOKEN
    for header in (None, "", "Bearer", "Bearer   ", f"Basic {TOKEN}", TOKEN):
        with pytest.raises(AuthError, match="missing bearer token"):
            bearer_token(header)


def test_a_body_over_the_limit_is_a_413_declared_or_streamed():
    app = _app((BodyLimit, {"limit": LIMIT, "advice": "; chunk it"}))
    declared, streamed, fits = _send(
        app,
        {"method": "POST", "url": "/echo", "content": b" " * (LIMIT + 1)},
        {"method": "POST", "url": "/echo", "content": _chunks(5, 400)},
        {"method": "POST", "url": "/echo", "content": b" " * LIMIT},
    )
    assert (declared.status_code, declared.json()["code"]) == (413, "payload_too_large")
    assert f"{LIMIT + 1} bytes" in declared.json()["message"]
    assert declared.json()["message"].endswith("; chunk it")
    assert streamed.status_code == 413 and "grew past" in streamed.json()["message"]
    assert (fits.status_code, fits.json()) == (200, {"received": LIMIT})


def test_the_token_is_checked_before_the_body_size_when_the_guard_is_outside():
    app = _app((BodyLimit, {"limit": LIMIT}), (GuardLayer, {"guard": TokenGuard(TOKEN)}))
    (answer,) = _send(app, {"method": "POST", "url": "/echo", "content": b" " * (2 * LIMIT)})
    assert answer.status_code == 401


def test_the_openapi_hook_amends_the_document_once_and_caches_it():
    from fastapi import FastAPI

    app = FastAPI(title="t", version="1")
    calls: list[int] = []

    def amend(schema: dict[str, Any]) -> None:
        calls.append(1)
        schema.setdefault("components", {})["extra"] = {"x": 1}

    install_openapi(app, amend)
    first, second = app.openapi(), app.openapi()
    assert first is second and first["components"]["extra"] == {"x": 1} and calls == [1]


def test_the_old_http_common_path_is_the_web_common_module():
    assert http_common is common and api.http_common is common


def test_the_http_app_refuses_a_missing_token_but_answers_health_and_unknown_routes(
    tmp_path: Path,
):
    app = http_app(RLServer(run_dir=tmp_path), FRONT_TOKEN, max_request_bytes=1000)
    refused, health, unknown, big = _send(
        app,
        {"method": "GET", "url": "/status"},
        {"method": "GET", "url": "/health"},
        {"method": "GET", "url": "/no-such-route"},
        {
            "method": "POST",
            "url": "/destroy",
            "content": b" " * 2000,
            "headers": {"Authorization": f"Bearer {FRONT_TOKEN}"},
        },
    )
    assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")
    assert "bearer" in refused.json()["message"]
    assert (health.status_code, unknown.status_code) == (200, 404)
    assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")


def test_the_tinker_app_answers_key_and_size_refusals_in_tinkers_form(monkeypatch):
    monkeypatch.setattr(tinker, "MAX_BODY_BYTES", 1000)
    app = tinker.build_app(None, FRONT_TOKEN)  # type: ignore[arg-type]  # no route gets that far
    key = {"X-API-Key": FRONT_TOKEN}
    missing, wrong, health, declared, streamed = _send(
        app,
        {"method": "POST", "url": "/api/v1/telemetry"},
        {"method": "POST", "url": "/api/v1/telemetry", "headers": {"X-API-Key": "tml-wrong"}},
        {"method": "GET", "url": "/api/v1/healthz"},
        {"method": "POST", "url": "/api/v1/telemetry", "content": b" " * 2000, "headers": key},
        {
            "method": "POST",
            "url": "/api/v1/create_session",
            "content": _chunks(5, 400),
            "headers": key,
        },
    )
    assert missing.status_code == 401
    assert missing.json() == {"error": "missing X-API-Key header (set TINKER_API_KEY)",
                              "category": "user"}  # fmt: skip
    assert wrong.status_code == 401 and "tml-wrong" not in wrong.text
    assert health.status_code == 200
    assert declared.status_code == 413 and declared.json()["category"] == "user"
    assert streamed.status_code == 413 and "grew past" in streamed.json()["error"]
