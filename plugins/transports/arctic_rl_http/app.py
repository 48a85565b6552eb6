"""The FastAPI app of the ``http`` transport: one route per entry of the operations table.

Every route hands its decoded payload to ``RLServer.handle``; the app itself only does
auth, size limits, body decoding (JSON or safetensors frame) and error mapping.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from arctic_platform.rl.api import (
    FRAME_CONTENT_TYPE,
    OPERATIONS,
    ByteCounter,
    InvalidRequestError,
    Operation,
    RLServer,
    TokenGuard,
    __version__,
    add_session_routes,
    decode_frame,
    encode_frame,
    http_common,
    install_openapi,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 256 * 1024 * 1024
OPEN_PATHS = frozenset({"/health"})
"""Routes that answer without a token (the docs and OpenAPI routes are open as well)."""

INLINE_OPS = frozenset({"health"})
"""Operations answered on the event loop, so they answer even when every worker thread is busy."""

_ERROR_SCHEMA = {
    "title": "ErrorBody",
    "type": "object",
    "properties": {"message": {"type": "string"}, "code": {"type": "string"}},
    "required": ["message", "code"],
}

JSON_CONTENT_TYPE = http_common.JSON_CONTENT_TYPE
error_response = http_common.error_response


def _decode_body(body: bytes, content_type: str) -> dict[str, Any]:
    """The payload of a JSON or frame body; an empty body is an empty payload."""
    if not body:
        return {}
    media = http_common.media_type(content_type)
    if media == FRAME_CONTENT_TYPE:
        payload = decode_frame(body)
    elif media in ("", JSON_CONTENT_TYPE) or media.endswith("+json"):
        payload = http_common.read_json_body(body)
    else:
        raise http_common.UnsupportedMediaTypeError(
            f"content type {media!r} is not accepted; send {JSON_CONTENT_TYPE} "
            f"or {FRAME_CONTENT_TYPE} (a safetensors frame)"
        )
    if not isinstance(payload, dict):
        raise InvalidRequestError(
            f"request body must be an object of named fields, got {type(payload).__name__}"
        )
    return payload


class _Endpoint:
    """The handler of one operation's route."""

    def __init__(
        self, op: Operation, server: RLServer, guard: TokenGuard, max_request_bytes: int
    ) -> None:
        self.op = op
        self.server = server
        self.guard = guard
        self.max_request_bytes = max_request_bytes

    async def __call__(self, request: Request) -> Response:
        try:
            self.guard.check(request.headers, self.op.path)
            payload: dict[str, Any] = {}
            if self.op.method != "GET":
                body = await http_common.read_body(request, self.max_request_bytes)
                content_type = request.headers.get("content-type", "")
                if http_common.is_frame(content_type):
                    payload = await run_in_threadpool(_decode_body, body, content_type)
                else:
                    payload = _decode_body(body, content_type)
            payload.update(request.path_params)
            for name in self.op.query:  # e.g. POST /restart?job_id=3
                if name in request.query_params:
                    payload[name] = request.query_params[name]
            if self.op.name in INLINE_OPS:
                result = self.server.handle(self.op.name, payload)
            else:
                result = await run_in_threadpool(self.server.handle, self.op.name, payload)
            if http_common.accepts_frame(request.headers.get("accept")):
                frame = await run_in_threadpool(
                    lambda: encode_frame(http_common.plain(result, keep_arrays=True))
                )
                return Response(frame, media_type=FRAME_CONTENT_TYPE)
            return Response(http_common.json_bytes(result), media_type=JSON_CONTENT_TYPE)
        except Exception as exc:
            status, message, code = http_common.error_status(exc)
            if status >= 500:
                logger.error("%s failed: %s", self.op.path, message, exc_info=True)
            return error_response(status, message, code)


def _openapi_extra(op: Operation) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{op.request.__name__}"}
    extra: dict[str, Any] = {}
    params = [p.strip("{}") for p in op.path.split("/") if p.startswith("{")]
    if params or op.query:
        props = op.request.model_json_schema()["properties"]
        extra["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": props.get(name, {})}
            for name in params
        ] + [
            {"name": name, "in": "query", "required": False, "schema": props.get(name, {})}
            for name in op.query
        ]
    if op.method != "GET":
        frame_doc = (
            f"a safetensors frame (arctic_platform.rl.protocol) whose decoded payload is a "
            f"{op.request.__name__}"
        )
        extra["requestBody"] = {
            "required": False,
            "content": {
                JSON_CONTENT_TYPE: {"schema": ref},
                FRAME_CONTENT_TYPE: {
                    "schema": {"type": "string", "format": "binary", "description": frame_doc}
                },
            },
        }
    answer: dict[str, Any] = {JSON_CONTENT_TYPE: {"schema": {"type": "object"}}}
    if op.frames:
        answer[FRAME_CONTENT_TYPE] = {"schema": {"type": "string", "format": "binary"}}
    error = {"content": {JSON_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Error"}}}}
    extra["responses"] = {
        "200": {"description": "the operation's result", "content": answer},
        "401": {"description": "missing or refused bearer token", **error},
        "413": {"description": "request body over the size limit", **error},
        "422": {"description": "invalid request (the message names the field)", **error},
        "default": {"description": "any other error", **error},
    }
    return extra


def _add_schemas(schema: dict[str, Any]) -> None:
    """The error body and every operation's pydantic request model as component schemas."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = _ERROR_SCHEMA
    for op in OPERATIONS:
        model_schema = op.request.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[op.request.__name__] = model_schema


def build_app(
    server: RLServer, token: str | None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> FastAPI:
    """A FastAPI app exposing every operation of ``server``; ``token`` None disables auth."""
    if max_request_bytes <= 0:
        raise ValueError(f"max_request_bytes must be positive, got {max_request_bytes}")
    app = FastAPI(
        title="Arctic RL server",
        version=__version__,
        description="JSON control and safetensors frames (application/octet-stream) over HTTP. "
        "Every route but /health needs 'Authorization: Bearer <token>'.",
    )
    guard = TokenGuard(token, open_paths=OPEN_PATHS)
    for op in OPERATIONS:
        doc = (op.request.__doc__ or "").strip().splitlines()
        app.add_api_route(
            op.path,
            _Endpoint(op, server, guard, max_request_bytes),
            methods=[op.method],
            name=op.name,
            operation_id=op.name,
            summary=op.name.replace("_", " "),
            description=getattr(getattr(server, op.name, None), "__doc__", None)
            or (doc[0] if doc else ""),
            openapi_extra=_openapi_extra(op),
            include_in_schema=True,
        )
    add_session_routes(app, server, token, max_request_bytes)
    install_openapi(app, _add_schemas)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = http_common.http_error_code(exc.status_code)
        return error_response(exc.status_code, str(exc.detail), code)

    async def request_invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, str(exc.errors()), "invalid_request")

    handlers: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
        StarletteHTTPException: http_error,
        RequestValidationError: request_invalid,
    }
    for exc_type, handler in handlers.items():
        app.add_exception_handler(exc_type, handler)
    app.add_middleware(ByteCounter, api="arctic_rl")
    return app


__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "build_app", "error_response"]
