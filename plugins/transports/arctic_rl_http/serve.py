"""Serve an ``RLServer`` over HTTP with uvicorn until its shutdown is requested."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

from arctic_platform.rl.api import ArcticRLError, RLServer, is_loopback, listening_socket
from arctic_rl_http.app import DEFAULT_MAX_REQUEST_BYTES, build_app

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 75
"""How long the server keeps an idle connection; longer than the client's pool expiry."""
_WATCH_INTERVAL = 0.1


class ServeError(ArcticRLError):
    """The http server refused to start (no token off loopback, or the address is taken)."""


def _bind(host: str, port: int) -> socket.socket:
    try:
        sock = listening_socket(host, port, 2048)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


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
    import uvicorn

    if token is None and not is_loopback(host):
        raise ServeError(
            f"refusing to serve on non-loopback address {host}:{port} without a token; "
            "give a token (arctic-rl serve --token-file, or ARCTIC_RL_TOKEN) or bind 127.0.0.1"
        )
    if token is not None and not token.strip():
        raise ServeError("the token is empty; give a non-empty token or None (loopback only)")
    app = build_app(server, token, max_request_bytes=max_request_bytes)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        access_log=log_level == "debug",
        lifespan="off",
        server_header=False,
    )
    uv = uvicorn.Server(config)
    sock = _bind(host, port)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if server.shutdown_requested.wait(_WATCH_INTERVAL):
                logger.info("shutdown requested: stopping the http server on %s:%s", host, port)
                uv.should_exit = True
                return

    watcher = threading.Thread(target=watch, name="http-shutdown-watch", daemon=True)
    watcher.start()
    logger.info("Arctic RL http server on %s:%s (auth %s)", host, port, "on" if token else "off")
    try:
        uv.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits the process on a failed start-up
        if uv.started:  # stopped by a signal after serving: not a failed start
            raise
        raise ServeError(f"the http server on {host}:{port} failed to start ({exc})") from None
    finally:
        done.set()
        watcher.join(timeout=1.0)
        with contextlib.suppress(OSError):
            sock.close()


__all__ = ["ServeError", "serve"]
