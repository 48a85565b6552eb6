"""Serve an ``RLServer`` over HTTP with uvicorn until its shutdown is requested."""

from __future__ import annotations

import logging

from arctic_platform.rl.api import RLServer, ServeError, check_serve_token, serve_http
from arctic_rl_http.app import DEFAULT_MAX_REQUEST_BYTES, build_app

logger = logging.getLogger(__name__)


def serve(
    server: RLServer,
    host: str,
    port: int,
    token: str | None,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    log_level: str = "info",
) -> None:
    """Run uvicorn in this thread until ``server.shutdown_requested`` is set, then return.

    Refuses (ServeError) to serve without a token on an address other than loopback.
    """
    check_serve_token(host, token)
    app = build_app(server, token, max_request_bytes=max_request_bytes)
    logger.info("Arctic RL http server on %s:%s (auth %s)", host, port, "on" if token else "off")
    serve_http(
        app, host, port, stop=server.shutdown_requested, log_level=log_level, name="http server"
    )


__all__ = ["ServeError", "serve"]
