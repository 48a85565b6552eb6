"""``HttpTransport``: the client side of the ``http`` transport, one kept-alive httpx client."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx

from arctic_platform.rl.api import (
    BY_NAME,
    FRAME_CONTENT_TYPE,
    ClientTransport,
    InvalidRequestError,
    Operation,
    ServerError,
    TransportError,
    encode_frame,
    http_common,
)

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers after which an idempotent operation is tried again."""
_RETRY_TIMEOUTS = (httpx.ConnectTimeout, httpx.PoolTimeout)


def _retryable(error: ServerError) -> bool:
    """A gateway-style answer worth another try; not the server's own engine timeout (504)."""
    return error.status_code in RETRY_STATUSES and error.code != "timeout"


class HttpTransport(ClientTransport):
    """Calls server operations over HTTP: JSON for control, safetensors frames for tensors.

    Only operations marked idempotent in the operations table are retried (with backoff) on
    connection errors and 502/503/504; any other failure raises at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str | None,
        *,
        timeout: float = 960.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.25,
    ) -> None:
        if retries < 0:
            raise InvalidRequestError(f"retries must be >= 0, got {retries}")
        self.host = host
        self.port = int(port)
        self.retries = retries
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.base_url = http_common.base_url(host, self.port)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = http_common.http_client(
            self.base_url, headers, timeout=timeout, connect_timeout=connect_timeout
        )
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return f"HttpTransport({self.base_url})"

    # --- requests -----------------------------------------------------------------------

    def _request(self, op: Operation, payload: dict[str, Any]) -> httpx.Request:
        body = dict(payload)
        path = op.path
        for part in op.path.split("/"):
            if part.startswith("{") and part.endswith("}"):
                name = part[1:-1]
                if name not in body:
                    raise TransportError(f"operation {op.name!r} needs {name!r} in its payload")
                path = path.replace(part, str(body.pop(name)))
        if op.method == "GET":
            params = {k: body[k] for k in op.query if body.get(k) is not None}
            return self._client.build_request("GET", path, params=params or None)
        if op.frames:
            return self._client.build_request(
                op.method,
                path,
                content=encode_frame(body),
                headers={"Content-Type": FRAME_CONTENT_TYPE, "Accept": FRAME_CONTENT_TYPE},
            )
        return self._client.build_request(
            op.method,
            path,
            content=http_common.json_bytes(body),
            headers={"Content-Type": http_common.JSON_CONTENT_TYPE},
        )

    def _error(self, op: Operation, response: httpx.Response) -> ServerError:
        refused = f"the server at {self.host}:{self.port} refused the bearer token for {op.name!r}"
        return http_common.server_error(response, refused)

    def call(self, operation: str, payload: dict[str, Any] | None = None) -> Any:
        """Invoke ``operation`` with ``payload``; its result, or ServerError/TransportError."""
        if self._closed.is_set():
            raise TransportError(f"{self!r} is closed")
        op = BY_NAME.get(operation)
        if op is None:
            raise TransportError(f"unknown operation {operation!r}; known: {sorted(BY_NAME)}")
        request = self._request(op, payload or {})
        attempts = 1 + (self.retries if op.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._client.send(request)
            except httpx.TimeoutException as exc:
                # A read timeout means the server may still be running the operation.
                if last or not isinstance(exc, _RETRY_TIMEOUTS):
                    raise TransportError(
                        f"{op.name} ({op.method} {op.path}) to {self.host}:{self.port} timed out "
                        f"({type(exc).__name__}) after {attempt + 1} attempt(s)"
                    ) from exc
            except httpx.TransportError as exc:
                if last:
                    raise TransportError(
                        f"cannot reach the Arctic RL server at {self.host}:{self.port} for "
                        f"{op.name} ({op.method} {op.path}) after {attempt + 1} attempt(s): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            else:
                if response.is_success:
                    return http_common.answer_value(response, op.name)
                error = self._error(op, response)
                if last or not _retryable(error):
                    raise error
            delay = http_common.backoff_delay(attempt, self.backoff)
            logger.debug("%s: retrying in %.2fs (attempt %d)", op.name, delay, attempt + 2)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def health(self) -> bool:
        """True when the server answers ``GET /health`` with 200; never raises."""
        try:
            response = self._client.get("/health", timeout=self.connect_timeout)
        except (httpx.HTTPError, OSError, RuntimeError):
            return False
        return response.status_code == 200

    def close(self) -> None:
        """Close the connection pool; later calls raise TransportError."""
        self._closed.set()
        self._client.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["HttpTransport"]
