"""Request guards of the HTTP front-ends: a shared-secret check and a body-size limit.

``TokenGuard`` compares the secret one header carries (``Authorization: Bearer`` or a key
header such as ``X-API-Key``) in constant time; an app calls it per route, or wraps itself
in ``GuardLayer`` to check every path. ``BodyLimit`` answers 413 for a body declared or
streamed over its limit. Both layers are plain ASGI (no per-request task or body copy) and
answer a refusal through ``respond`` (default: the ``{"message", "code"}`` error body).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from arctic_platform.rl.errors import ArcticRLError, AuthError, PayloadTooLargeError
from arctic_platform.rl.web.common import error_response, too_large

BEARER_MISSING = "missing bearer token: send 'Authorization: Bearer <token>'"
BEARER_REFUSED = "the bearer token was refused"

Respond = Callable[[ArcticRLError], Any]
"""Makes the ASGI response (a starlette ``Response``) that answers a refused request."""


def refusal_response(exc: ArcticRLError) -> Any:
    """The ``{"message", "code"}`` answer with ``exc``'s status."""
    return error_response(exc.status, str(exc), exc.code)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; AuthError when there is none."""
    scheme, _, supplied = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not supplied.strip():
        raise AuthError(BEARER_MISSING)
    return supplied.strip()


def scope_headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """An ASGI scope's request headers by lower-case name (the first of repeated ones)."""
    headers: dict[str, str] = {}
    for key, value in scope.get("headers") or ():
        headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


class TokenGuard:
    """The one secret every request but those to ``open_paths`` must carry in ``header``.

    ``token`` None lets every request through. For the ``authorization`` header the value is
    a bearer token; for any other header it is the secret itself.
    """

    def __init__(
        self,
        token: str | None,
        *,
        header: str = "authorization",
        open_paths: Iterable[str] = (),
        missing: str = BEARER_MISSING,
        refused: str = BEARER_REFUSED,
    ) -> None:
        self.expected = token.encode() if token is not None else None
        self.header = header.lower()
        self.open_paths = frozenset(open_paths)
        self.missing = missing
        self.refused = refused

    def check(self, headers: Mapping[str, str], path: str) -> None:
        """Raise AuthError unless the request to ``path`` with ``headers`` may pass."""
        if self.expected is None or path in self.open_paths:
            return
        value = headers.get(self.header)
        if self.header == "authorization":
            try:
                supplied = bearer_token(value)
            except AuthError:
                raise AuthError(self.missing) from None
        else:
            supplied = (value or "").strip()
            if not supplied:
                raise AuthError(self.missing)
        if not hmac.compare_digest(supplied.encode(), self.expected):
            raise AuthError(self.refused)


class GuardLayer:
    """ASGI middleware: ``guard`` checks every HTTP request before the app sees it."""

    def __init__(self, app: Any, guard: TokenGuard, respond: Respond = refusal_response) -> None:
        self.app = app
        self.guard = guard
        self.respond = respond

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            try:
                self.guard.check(scope_headers(scope), scope["path"])
            except AuthError as exc:
                await self.respond(exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is a 413, declared or streamed.

    A declared ``Content-Length`` over the limit is answered before the app runs; a body that
    grows past it raises ``PayloadTooLargeError`` from ``receive`` (the app may answer it;
    if it does not and has not answered yet, this layer does). ``advice`` ends the message.
    """

    def __init__(
        self, app: Any, limit: int, advice: str = "", respond: Respond = refusal_response
    ) -> None:
        self.app = app
        self.limit = limit
        self.advice = advice
        self.respond = respond

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = scope_headers(scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await self.respond(too_large(self.limit, int(declared), self.advice))(
                scope, receive, send
            )
            return
        received = 0
        started = False

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit, None, self.advice)
            return message

        async def sending(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited, sending)
        except PayloadTooLargeError as exc:
            if started:
                raise
            await self.respond(exc)(scope, receive, send)


__all__ = [
    "BEARER_MISSING",
    "BEARER_REFUSED",
    "BodyLimit",
    "GuardLayer",
    "TokenGuard",
    "bearer_token",
    "refusal_response",
    "scope_headers",
]
