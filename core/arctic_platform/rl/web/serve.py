"""The one way an HTTP front-end serves: bind, the token rule, uvicorn until a stop, clean exit.

``serve_http`` is shared by the ``http`` and ``tinker`` transports and the platform server:
uvicorn without lifespan, without a ``Server`` header and with a 75 s keep-alive, stopped in
order when a ``threading.Event`` is set (or, when asked, on SIGTERM/SIGINT). uvicorn is
imported when ``serve_http`` is called.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from typing import Any

from arctic_platform.rl.errors import ServeError
from arctic_platform.rl.network import listening_socket, token_rule_violation

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 75
"""How long a server keeps an idle connection; longer than the clients' pool expiry (30 s)."""
BACKLOG = 2048
WATCH_INTERVAL = 0.1
"""Seconds between two looks at the stop event."""


def check_serve_token(host: str, token: str | None) -> None:
    """Refuse (ServeError) an empty token, or no token on an address other than loopback."""
    refusal = token_rule_violation(host, token)
    if refusal is not None:
        raise ServeError(refusal)


def server_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; ServeError naming the address when it can't be."""
    try:
        return listening_socket(host, port, BACKLOG)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from exc


def stop_on_signals(stop: threading.Event) -> None:
    """From now on SIGTERM and SIGINT set ``stop`` (call it from the main thread).

    The handlers stay after serving, so a second signal during the caller's clean-up does
    not kill the process half-way; uvicorn passes a signal it caught on to them when it ends.
    """

    def _stop(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def serve_http(
    app: Any,
    host: str,
    port: int,
    *,
    sock: socket.socket | None = None,
    stop: threading.Event | None = None,
    log_level: str = "info",
    name: str = "http server",
) -> None:
    """Serve the ASGI ``app`` on ``host:port`` in this thread until ``stop`` is set; return then.

    ``sock`` is a socket already listening there (else one is bound: ServeError if it can't
    be); it is closed on return. A start that fails is a ServeError; a ``SystemExit`` raised
    by a signal after the start passes on (see ``stop_on_signals`` for orderly signals).
    """
    import uvicorn

    stop = stop if stop is not None else threading.Event()
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        access_log=log_level == "debug",
        lifespan="off",
        server_header=False,
    )
    server = uvicorn.Server(config)
    sock = sock if sock is not None else server_socket(host, port)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(WATCH_INTERVAL):
                logger.info("stop requested: stopping the %s on %s:%s", name, host, port)
                server.should_exit = True
                return

    watcher = threading.Thread(target=watch, name=f"{name}-stop-watch", daemon=True)
    watcher.start()
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits the process when it fails to start
        if server.started:  # a signal after serving began: not a failed start
            raise
        raise ServeError(f"the {name} on {host}:{port} failed to start ({exc})") from None
    finally:
        done.set()
        watcher.join(timeout=1.0)
        with contextlib.suppress(OSError):
            sock.close()


__all__ = [
    "BACKLOG",
    "KEEP_ALIVE_SECONDS",
    "check_serve_token",
    "serve_http",
    "server_socket",
    "stop_on_signals",
]
