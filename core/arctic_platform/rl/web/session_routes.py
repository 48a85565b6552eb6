"""OpenAI-compatible routes of agent sessions, mounted by the http transport's app and, for a
transport that is not HTTP (``ray``), served on their own by ``SessionHTTPServer``.

Under ``/s/{sid}/v1``: ``POST /chat/completions`` (SSE with ``"stream": true``: the turn is
sampled whole, then streamed), ``POST /completions`` (a text or token-id prompt) and
``GET /models``; vLLM's token-in
``POST /s/{sid}/inference/v1/generate``. The same routes without the ``/s/{sid}`` prefix find
the session from an ``X-Session-ID`` header or from the session key sent as the bearer API key.

Auth: with a server token (required off loopback) a request carries either that token or the
session's key as its bearer; without one, any request to an open session passes. Errors are
OpenAI's ``{"error": {"message", "type", "code"}}``: 404 for an unknown or expired session,
400 for a malformed body or a prompt over the context (a 422 is answered as 400).
fastapi and starlette are imported by the functions that need them.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.agents.openai_stream import sse_events
from arctic_platform.rl.errors import AuthError, BadRequestError, NotFoundError
from arctic_platform.rl.web import common as http_common

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
}


def openai_error(exc: BaseException) -> Response:
    """OpenAI's error answer for ``exc``: its status (422 read as 400) and a typed body."""
    status, message, code = http_common.error_status(exc)
    if status == 422:
        status = 400
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "code": code, "param": None}}
    return http_common.json_response(body, status)


def _bearer(headers: Any) -> str | None:
    scheme, _, value = (headers.get("authorization") or "").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


@dataclass(eq=False)
class SessionRoute:
    """One session route: auth, body, the ``AgentOps`` call in a worker thread, errors."""

    server: Any
    token: str | None
    call: Callable[[Any, str, Any], dict[str, Any]]
    max_request_bytes: int
    _: KW_ONLY
    has_body: bool
    stream: Callable[[Any, str, Any], list[dict[str, Any]]] | None = None

    def _session_id(self, agents: Any, request: Request) -> str:
        """The session of ``request``, checked against the token rule."""
        bearer = _bearer(request.headers)
        by_key = agents.session_for_key(bearer)
        sid = request.path_params.get("sid") or request.headers.get(SESSION_HEADER) or by_key
        if not sid:
            raise NotFoundError(
                "no agent session given: use the /s/{sid}/v1 base URL, the session key as the "
                "API key, or an X-Session-ID header"
            )
        if self.token is not None:
            is_token = bearer is not None and hmac.compare_digest(bearer, self.token)
            if not is_token and by_key != sid:
                if bearer is None:
                    raise AuthError("send the session key (or the server token) as the API key")
                agents.authorize(sid, None)  # an unknown session is a 404 before a 401
                raise AuthError("the API key is neither this session's key nor the server token")
        agents.authorize(sid, None)
        return str(sid)

    async def __call__(self, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import StreamingResponse

        try:
            agents = getattr(self.server, "agents", None)
            if agents is None:
                raise NotFoundError("this server has no agent sessions")
            sid = self._session_id(agents, request)
            body: Any = None
            if self.has_body:
                raw = await http_common.read_body(request, self.max_request_bytes)
                if not raw:
                    raise BadRequestError("the request has no JSON body")
                body = http_common.read_json_body(raw)
            if self.stream is not None and isinstance(body, dict) and body.get("stream") is True:
                chunks = await run_in_threadpool(self.stream, agents, sid, body)
                return StreamingResponse(sse_events(chunks), media_type="text/event-stream")
            result = await run_in_threadpool(self.call, agents, sid, body)
            return http_common.json_response(result)
        except Exception as exc:
            status = http_common.error_status(exc)[0]
            if status >= 500:
                logger.error("%s failed: %s", request.url.path, exc, exc_info=True)
            return openai_error(exc)


# vLLM-fork extensions a token-in client may put in ``sampling_params`` that do not change what
# is sampled; verifiers' TrainClient adds the first on a bridged turn (MoE routing replay).
IGNORED_SAMPLING_KEYS = ("routed_experts_prompt_start",)


def _token_generate(agents: Any, sid: str, body: Any) -> dict[str, Any]:
    """The token-in generate call, with ``IGNORED_SAMPLING_KEYS`` taken out of its params."""
    params = body.get("sampling_params") if isinstance(body, dict) else None
    if isinstance(params, dict) and any(key in params for key in IGNORED_SAMPLING_KEYS):
        kept = {k: v for k, v in params.items() if k not in IGNORED_SAMPLING_KEYS}
        body = {**body, "sampling_params": kept}
    return agents.token_generate(sid, body)


ROUTES: tuple[tuple[str, str, str, Callable[[Any, str, Any], dict[str, Any]]], ...] = (
    ("POST", "/v1/chat/completions", "chat_completions", lambda a, s, b: a.chat_completion(s, b)),
    ("POST", "/v1/completions", "completions", lambda a, s, b: a.completion(s, b)),
    ("GET", "/v1/models", "models", lambda a, s, b: a.models(s)),
    ("POST", "/inference/v1/generate", "token_generate", _token_generate),
)

STREAMS: dict[str, Callable[[Any, str, Any], list[dict[str, Any]]]] = {
    "chat_completions": lambda a, s, b: a.chat_completion_chunks(s, b),
}
"""Routes that answer ``"stream": true`` with server-sent events (the chunks, then [DONE])."""


def add_session_routes(
    app: FastAPI, server: Any, token: str | None, max_request_bytes: int
) -> None:
    """Mount the session routes, under ``/s/{sid}`` and (session from header or key) bare."""
    for method, path, name, call in ROUTES:
        stream = STREAMS.get(name)
        route = SessionRoute(
            server, token, call, max_request_bytes, has_body=method == "POST", stream=stream
        )
        for prefix in ("/s/{sid}", ""):
            # a bound method: starlette hands it the Request (no signature inspection)
            app.add_route(
                prefix + path,
                route.__call__,
                methods=[method],
                name=f"session_{name}" + ("_by_header" if not prefix else ""),
                include_in_schema=False,
            )


def session_app(server: Any, token: str | None, max_request_bytes: int) -> FastAPI:
    """An app with only the session routes of ``server`` (and an open ``GET /health``)."""
    from fastapi import FastAPI

    app = FastAPI(title="Arctic RL agent sessions", openapi_url=None, docs_url=None)
    add_session_routes(app, server, token, max_request_bytes)

    async def health() -> dict[str, bool]:
        return {"ok": True}

    app.add_api_route("/health", health, methods=["GET"], include_in_schema=False)
    return app


class SessionHTTPServer:
    """The session routes of an ``RLServer`` served over HTTP in a thread of its process, for a
    transport that is not HTTP itself: agent frameworks speak HTTP whatever the client uses.

    ``start`` binds ``host:port`` (port 0: a free one; the token rule applies) and serves until
    ``stop`` is set; ``root`` is then the address to put before a session's ``base_url_path``.
    """

    def __init__(
        self,
        server: Any,
        host: str,
        token: str | None,
        *,
        port: int = 0,
        max_request_bytes: int = 16 * 1024 * 1024,
        stop: threading.Event | None = None,
    ) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.stop = stop if stop is not None else threading.Event()
        self.root: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Bind, start serving in a daemon thread and return ``root`` (``http://host:port``)."""
        from arctic_platform.rl.web.serve import check_serve_token, serve_http, server_socket

        check_serve_token(self.host, self.token)
        sock = server_socket(self.host, self.port)
        port = int(sock.getsockname()[1])
        app = session_app(self.server, self.token, self.max_request_bytes)
        self._thread = threading.Thread(
            target=serve_http,
            args=(app, self.host, port),
            kwargs={
                "sock": sock,
                "stop": self.stop,
                "log_level": "warning",
                "name": "session http server",
            },
            name="session-http",
            daemon=True,
        )
        self._thread.start()
        self.root = http_common.base_url(self.host, port)
        logger.info("agent sessions served over http at %s", self.root)
        return self.root

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and wait (up to ``timeout`` s) for the thread to end."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


__all__ = [
    "SESSION_HEADER",
    "SessionHTTPServer",
    "add_session_routes",
    "openai_error",
    "session_app",
]
