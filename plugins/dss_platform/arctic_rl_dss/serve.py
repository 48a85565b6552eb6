"""``arctic-rl platform serve``: the reference platform server (uvicorn, RLServer on Ray)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import (
    ArcticRLError,
    is_loopback,
    serve_http,
    server_socket,
    stop_on_signals,
)
from arctic_rl_dss.users import Users

logger = logging.getLogger(__name__)


def serve_platform(
    *,
    host: str,
    port: int,
    tokens_file: str,
    run_dir: str | None = None,
    num_gpus: int = 4,
    op_timeout: float = 900.0,
    log_level: str = "info",
    **_: Any,
) -> int:
    """Serve the platform API until SIGTERM/SIGINT; returns the process exit code."""
    from arctic_platform.rl.api import RLServer, arctic_home
    from arctic_rl_dss.app import build_app
    from arctic_rl_dss.service import PlatformService
    from arctic_rl_dss.store import Store

    try:
        users = Users.load(tokens_file)
        sock = server_socket(host, port)
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(host):
        logger.warning(
            "serving on %s without TLS: tokens travel in clear text; put a TLS-terminating "
            "proxy in front of this server",
            host,
        )
    root = Path(run_dir) if run_dir else arctic_home() / "platform" / f"{host}_{port}"
    root.mkdir(parents=True, exist_ok=True)
    rl = RLServer(root, num_gpus=num_gpus, ray_auto_attach=False, op_timeout=op_timeout)
    store = Store(root / "platform.sqlite3")
    service = PlatformService(rl, store, users)
    pid_file = root / "platform.pid"
    stop = threading.Event()
    try:
        rl.start()  # Ray's start puts its own SIGTERM handler in: ours go in after it
        stop_on_signals(stop)
        pid_file.write_text(str(os.getpid()))
        logger.info(
            "Arctic RL platform on %s:%s for %d user(s), run dir %s",
            host,
            port,
            len(users.users),
            root,
        )
        serve_http(
            build_app(service),
            host,
            port,
            sock=sock,
            stop=stop,
            log_level=log_level,
            name="platform server",
        )
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        service.close()
        rl.close()
        store.close()
        sock.close()
        pid_file.unlink(missing_ok=True)
    return 0
