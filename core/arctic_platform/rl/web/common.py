"""JSON, error and body plumbing shared by the HTTP apps and clients, and the httpx pool.

JSON bodies (answers and requests alike) follow one rule for non-finite floats: NaN, +inf and
-inf are written as the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``. Python's ``json``
(and so httpx's ``Response.json``) reads them back as floats, so a metric that is NaN stays a
float NaN end to end; a strict JSON reader needs its NaN option (JSON5 reads them as they are).
Error answers are ``{"message", "code"}`` (plus optional extra fields) with the status of the
``ArcticRLError`` raised. Nothing here imports fastapi, starlette or httpx until a function
that needs one is called. (Formerly ``arctic_platform.rl.http_common``, now a shim of this.)
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from arctic_platform.rl.errors import (
    ArcticRLError,
    BadRequestError,
    PayloadTooLargeError,
    ServerError,
    TransportError,
    UnsupportedMediaTypeError,
)
from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE, decode_frame

if TYPE_CHECKING:  # pragma: no cover
    import httpx
    from starlette.requests import Request
    from starlette.responses import Response

JSON_CONTENT_TYPE = "application/json"
POOL_KEEPALIVE_SECONDS = 30.0
"""Clients drop idle connections before the servers' keep-alive (75 s) ends."""
HTTP_ERROR_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}
"""The ``code`` of an error the web framework raised itself (no route, wrong method, ...)."""


# --- JSON ------------------------------------------------------------------------------------


def plain(value: Any, *, keep_arrays: bool = False) -> Any:
    """``value`` with numpy/torch scalars made Python numbers and arrays listed (or kept)."""
    if isinstance(value, dict):
        return {str(k): plain(v, keep_arrays=keep_arrays) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, keep_arrays=keep_arrays) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # numpy array/scalar, torch tensor
        if keep_arrays and getattr(value, "ndim", 0) > 0:
            return value
        return value.tolist()
    if hasattr(value, "item"):  # numpy scalar without shape
        return value.item()
    return value


def json_bytes(value: Any) -> bytes:
    """``value`` as compact JSON; non-finite floats as ``NaN``/``Infinity``/``-Infinity``."""
    return json.dumps(plain(value), allow_nan=True, separators=(",", ":")).encode()


def media_type(content_type: str | None) -> str:
    """The bare, lower-case media type of a ``Content-Type`` header ('' when absent)."""
    return (content_type or "").split(";")[0].strip().lower()


def is_frame(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names a safetensors frame."""
    return media_type(content_type) == FRAME_CONTENT_TYPE


def accepts_frame(accept: str | None) -> bool:
    """Whether an ``Accept`` header lists the frame media type."""
    return any(media_type(part) == FRAME_CONTENT_TYPE for part in (accept or "").split(","))


def read_json_body(body: bytes) -> Any:
    """A JSON request body; a ``BadRequestError`` when it is not JSON (or nested too deeply)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise BadRequestError("request body is nested too deeply to be read as JSON") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from None


# --- errors ----------------------------------------------------------------------------------


def error_body(message: str, code: str, **extra: Any) -> dict[str, Any]:
    """The error answer's body: ``{"message", "code"}`` and any ``extra`` fields."""
    return {"message": message, "code": code, **extra}


def error_parts(errors: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each validation error (pydantic or FastAPI) as ``'field.path: message'``."""
    return [
        f"{'.'.join(str(p) for p in err.get('loc', ())) or 'body'}: {err.get('msg', 'invalid')}"
        for err in errors
    ]


def http_error_code(status: int) -> str:
    """The ``code`` for a status the web framework answered by itself."""
    return HTTP_ERROR_CODES.get(status, "http_error")


def error_status(exc: BaseException) -> tuple[int, str, str]:
    """``(status, message, code)`` answering ``exc``: its own for an ``ArcticRLError``, 422
    for a pydantic ``ValidationError``, 500 ``internal_error`` for anything else."""
    if isinstance(exc, ArcticRLError):
        return exc.status, str(exc), exc.code
    if isinstance(exc, ValidationError):
        message = f"invalid {exc.title} request: " + "; ".join(error_parts(exc.errors()))
        return 422, message, "invalid_request"
    return 500, f"{type(exc).__name__}: {exc}", "internal_error"


def too_large(limit: int, size: int | None = None, advice: str = "") -> PayloadTooLargeError:
    """The 413 for a body of ``size`` bytes (None: one that grew past ``limit`` as it came)."""
    if size is None:
        return PayloadTooLargeError(
            f"the request body grew past the server's limit of {limit} bytes{advice}"
        )
    return PayloadTooLargeError(
        f"a request body of {size} bytes is over the server's limit of {limit} bytes{advice}"
    )


# --- server side (starlette imported when called) ----------------------------------------


def json_response(data: Any, status: int = 200) -> Response:
    """A JSON answer under the module's non-finite rule."""
    from starlette.responses import Response

    return Response(json_bytes(data), status_code=status, media_type=JSON_CONTENT_TYPE)


def error_response(status: int, message: str, code: str, **extra: Any) -> Response:
    """The JSON error answer ``{"message", "code", **extra}`` with ``status``."""
    return json_response(error_body(message, code, **extra), status)


async def read_body(request: Request, limit: int, advice: str = "") -> bytes:
    """The request body, refusing (413) a declared or streamed size over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequestError(f"Content-Length {declared!r} is not a number") from None
        if size > limit:
            raise too_large(limit, size, advice)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise too_large(limit, None, advice)
        chunks.append(chunk)
    return b"".join(chunks)


# --- client side (httpx imported when called) ----------------------------------------------


def base_url(host: str, port: int) -> str:
    """``http://host:port`` with an IPv6 host in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def http_client(
    url: str, headers: Mapping[str, str], *, timeout: float, connect_timeout: float
) -> httpx.Client:
    """A kept-alive httpx client that never takes a proxy from the environment."""
    import httpx

    return httpx.Client(
        base_url=url,
        headers=dict(headers),
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        limits=httpx.Limits(keepalive_expiry=POOL_KEEPALIVE_SECONDS),
        trust_env=False,
    )


def backoff_delay(
    attempt: int, base: float, cap: float | None = None, jitter: bool = False
) -> float:
    """Seconds before retry ``attempt + 1``: ``base * 2**attempt``, capped, optionally jittered
    down to half."""
    delay = base * 2**attempt
    if cap is not None:
        delay = min(cap, delay)
    return delay * random.uniform(0.5, 1.0) if jitter else delay


def server_error(response: httpx.Response, refused: str) -> ServerError:
    """The ``ServerError`` of a failed answer; ``refused`` prefixes the message of a 401."""
    message, code = response.text, None
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        message = str(data.get("message") or data.get("detail") or message)
        code = data.get("code")
    if response.status_code == 401:
        message = f"{refused}: {message}"
    return ServerError(response.status_code, message, code)


def answer_value(response: httpx.Response, what: str) -> Any:
    """A successful answer's value: a decoded frame, None for no body, else its JSON."""
    if is_frame(response.headers.get("content-type")):
        return decode_frame(response.content)
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise TransportError(f"{what}: the server's answer is not JSON: {exc}") from exc


__all__ = [
    "HTTP_ERROR_CODES",
    "JSON_CONTENT_TYPE",
    "POOL_KEEPALIVE_SECONDS",
    "BadRequestError",
    "UnsupportedMediaTypeError",
    "accepts_frame",
    "answer_value",
    "backoff_delay",
    "base_url",
    "error_body",
    "error_parts",
    "error_response",
    "error_status",
    "http_client",
    "http_error_code",
    "is_frame",
    "json_bytes",
    "json_response",
    "media_type",
    "plain",
    "read_body",
    "read_json_body",
    "server_error",
    "too_large",
]
