"""Serve an ``RLServer`` through the Tinker SDK's REST API with uvicorn until shutdown."""

from __future__ import annotations

import contextlib
import logging
import threading

from arctic_platform.rl.api import ArcticRLError, RLServer, is_loopback, listening_socket
from arctic_rl_tinker.app import build_app
from arctic_rl_tinker.frontend import TinkerFrontend

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "tml-"
"""The SDK sends a key only if it starts with this (or is a JWT)."""
_WATCH_INTERVAL = 0.1


class ServeError(ArcticRLError):
    """The tinker server refused to start (bad token, no token off loopback, port taken)."""


def no_client(*args: object, **kwargs: object) -> None:
    """The client side: there is none; the tinker SDK is this transport's client."""
    raise ServeError(
        "the tinker transport has no ArcticRLClient side: use comm_protocol 'http' or 'ray', "
        "or talk to `arctic-rl serve --transport tinker` with the tinker SDK"
    )


def check_token(token: str | None, host: str) -> None:
    """Refuse a token the SDK would never send, and no token on a non-loopback address."""
    if token is None:
        if not is_loopback(host):
            raise ServeError(
                f"refusing to serve the Tinker API on non-loopback address {host} without a "
                "token; give one starting with 'tml-' (--token-file or ARCTIC_RL_TOKEN)"
            )
        return
    if not token.startswith(TOKEN_PREFIX) or len(token) <= len(TOKEN_PREFIX):
        raise ServeError(
            "the token must start with 'tml-' (the tinker SDK refuses any other API key); "
            "clients set TINKER_API_KEY to the same value"
        )


def serve(
    server: RLServer,
    host: str,
    port: int,
    token: str | None,
    *,
    log_level: str = "info",
) -> None:
    """Run the Tinker API in this thread until ``server.shutdown_requested`` is set."""
    import uvicorn

    check_token(token, host)
    frontend = TinkerFrontend(server)
    app = build_app(frontend, token)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_keep_alive=75,
        access_log=log_level == "debug",
        lifespan="off",
        server_header=False,
    )
    uv = uvicorn.Server(config)
    try:
        sock = listening_socket(host, port, 2048)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from exc
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if server.shutdown_requested.wait(_WATCH_INTERVAL):
                uv.should_exit = True
                return

    watcher = threading.Thread(target=watch, name="tinker-shutdown-watch", daemon=True)
    watcher.start()
    logger.info(
        "Arctic RL Tinker API on http://%s:%s (auth %s); clients: TINKER_BASE_URL=http://%s:%s",
        host,
        port,
        "on" if token else "off",
        host,
        port,
    )
    try:
        uv.run(sockets=[sock])
    except SystemExit as exc:
        if uv.started:  # stopped by a signal after serving: not a failed start
            raise
        raise ServeError(f"the tinker server on {host}:{port} failed to start ({exc})") from None
    finally:
        done.set()
        watcher.join(timeout=1.0)
        frontend.close()
        with contextlib.suppress(OSError):
            sock.close()


__all__ = ["ServeError", "check_token", "no_client", "serve"]
