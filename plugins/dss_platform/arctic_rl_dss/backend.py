"""The ``dss-platform`` backend: a remote platform owns the GPUs; nothing starts locally.

The token comes from ``ARCTIC_RL_PAT`` or the file named by ``ARCTIC_RL_PAT_FILE`` (the
client config has no place for secrets: its fields travel to the platform with the job).
Polling and chunking can be tuned with ``ARCTIC_RL_DSS_POLL_INITIAL``/``_POLL_FACTOR``/
``_POLL_MAX``/``_POLL_TIMEOUT``, ``ARCTIC_RL_DSS_RETRIES`` and ``ARCTIC_RL_DSS_CHUNK_BYTES``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import ArcticRLClientConfig, ArcticRLError, Backend
from arctic_rl_dss.chunks import DEFAULT_CHUNK_BYTES
from arctic_rl_dss.transport import DssTransport, PollSettings

TOKEN_ENV = "ARCTIC_RL_PAT"
TOKEN_FILE_ENV = "ARCTIC_RL_PAT_FILE"


class DssConfigError(ArcticRLError):
    """The dss-platform backend cannot start: no token, no address, or a bad setting."""

    status = 422
    code = "dss_config"
    remedy = "Set the token (ARCTIC_RL_PAT) and the server address, or fix the setting named."


def read_token() -> str:
    """The personal access token from the environment; DssConfigError when there is none."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    path = os.environ.get(TOKEN_FILE_ENV)
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise DssConfigError(
                f"{TOKEN_FILE_ENV}={path}: cannot read the token ({exc})"
            ) from None
    if not token:
        raise DssConfigError(
            f"backend='dss-platform' needs a personal access token: set {TOKEN_ENV} (or "
            f"{TOKEN_FILE_ENV} to a file holding it); nothing was sent to the platform"
        )
    return token


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        number = float(value)
    except ValueError:
        raise DssConfigError(f"{name}={value!r} is not a number") from None
    if number <= 0:
        raise DssConfigError(f"{name}={value!r} must be positive")
    return number


def settings_from_env() -> dict[str, Any]:
    """Transport keyword arguments from the ``ARCTIC_RL_DSS_*`` variables."""
    poll = PollSettings(
        initial=_env_float("ARCTIC_RL_DSS_POLL_INITIAL", 0.5),
        factor=_env_float("ARCTIC_RL_DSS_POLL_FACTOR", 1.25),
        maximum=_env_float("ARCTIC_RL_DSS_POLL_MAX", 6.0),
        timeout=_env_float("ARCTIC_RL_DSS_POLL_TIMEOUT", 1800.0),
    )
    return {
        "poll": poll,
        "retries": int(_env_float("ARCTIC_RL_DSS_RETRIES", 10)),
        "chunk_bytes": int(_env_float("ARCTIC_RL_DSS_CHUNK_BYTES", DEFAULT_CHUNK_BYTES)),
    }


class DssPlatformBackend(Backend):
    """Connects to the platform at the config's host and port; owns no process."""

    def __init__(self) -> None:
        self.transport: DssTransport | None = None

    def start(self, config: ArcticRLClientConfig) -> DssTransport:
        """A transport to the platform, after checking the token and the address."""
        token = read_token()
        if not config.host or not config.port:
            raise DssConfigError(
                "backend='dss-platform' needs host and port of the platform server in the config"
            )
        counts = (config.training_gpus, config.sampling_gpus, config.log_prob_gpus)
        if not config.reconnect_mode and not any(c > 0 for c in counts):
            raise DssConfigError(
                "backend='dss-platform' needs training_gpus, sampling_gpus or log_prob_gpus > 0 "
                "(or job ids to reconnect)"
            )
        transport = DssTransport(config.host, config.port, token, **settings_from_env())
        try:
            transport.call("health")
            transport._send("GET", "/capacity", what="checking the token")
        except BaseException:
            transport.close()
            raise
        self.transport = transport
        return transport

    def stop(self) -> None:
        """Nothing runs locally; the jobs were cancelled by the client before this."""
