"""Serve an ``RLServer`` through the Tinker SDK's REST API with uvicorn until shutdown."""

from __future__ import annotations

import logging
import os

from arctic_platform.rl.api import RLServer, ServeError, check_serve_token, serve_http
from arctic_rl_tinker.app import build_app
from arctic_rl_tinker.frontend import TinkerFrontend
from arctic_rl_tinker.gpu_seats import server_gpus

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "tml-"
"""The SDK sends a key only if it starts with this (or is a JWT)."""
FULL_FINE_TUNING_ENV = "ARCTIC_RL_TINKER_FULL_FINE_TUNING"
"""Set to 1 to train every Tinker model's full weights instead of a LoRA adapter."""


def full_fine_tuning() -> bool:
    """Whether the server was told (``ARCTIC_RL_TINKER_FULL_FINE_TUNING=1``) to train the full
    weights of every model."""
    value = os.environ.get(FULL_FINE_TUNING_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ServeError(f"{FULL_FINE_TUNING_ENV}={value!r}: set it to 1 (full weights) or 0 (LoRA)")


POOL_GPUS_ENV = "ARCTIC_RL_TINKER_POOL_GPUS"
"""GPUs each LoRA pool (one base model and LoRA shape) takes; default 1 (see gpu_seats)."""


def pool_gpus(total: int) -> int:
    """GPUs a LoRA pool takes (``ARCTIC_RL_TINKER_POOL_GPUS``, default 1): a whole number from
    1 to the server's ``total``."""
    value = os.environ.get(POOL_GPUS_ENV, "").strip() or "1"
    if not value.isdigit() or not 1 <= int(value) <= max(total, 1):
        raise ServeError(
            f"{POOL_GPUS_ENV}={value!r}: set it to a whole number of GPUs from 1 to the "
            f"server's {max(total, 1)} (each LoRA shape's pool takes that many)"
        )
    return int(value)


def no_client(*args: object, **kwargs: object) -> None:
    """The client side: there is none; the tinker SDK is this transport's client."""
    raise ServeError(
        "the tinker transport has no ArcticRLClient side: use comm_protocol 'http' or 'ray', "
        "or talk to `arctic-rl serve --transport tinker` with the tinker SDK"
    )


def check_token(token: str | None, host: str) -> None:
    """Refuse a token the SDK would never send, and no token on a non-loopback address."""
    check_serve_token(host, token)
    if token is not None and (not token.startswith(TOKEN_PREFIX) or token == TOKEN_PREFIX):
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
    check_token(token, host)
    full = full_fine_tuning()
    if full:
        logger.warning(
            "%s is set: every Tinker model trains its full weights (no LoRA; each model costs "
            "a full training and sampling job, and LoRA-tuned learning rates are ~10x too high)",
            FULL_FINE_TUNING_ENV,
        )
    share = pool_gpus(server_gpus(server))
    frontend = TinkerFrontend(server, full_fine_tuning=full, pool_gpus=share)
    try:
        app = build_app(frontend, token)
        logger.info(
            "Arctic RL Tinker API on http://%s:%s (auth %s); clients: TINKER_BASE_URL=http://%s:%s",
            host,
            port,
            "on" if token else "off",
            host,
            port,
        )
        serve_http(
            app,
            host,
            port,
            stop=server.shutdown_requested,
            log_level=log_level,
            name="tinker server",
        )
    finally:
        frontend.close()


__all__ = [
    "FULL_FINE_TUNING_ENV",
    "POOL_GPUS_ENV",
    "ServeError",
    "check_token",
    "full_fine_tuning",
    "no_client",
    "pool_gpus",
    "serve",
]
