"""Clients for tests: environment variables (``ARCTIC_RL_HOME``, tokens) swapped and restored,
a client holding a personal access token, and a local-backend client with its own state dir."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.config import ArcticRLClientConfig


@contextmanager
def swapped_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for ``None``, remove) the variables in ``values``; restore them all at exit."""
    old = {key: os.environ.get(key) for key in values}
    try:
        _set_env(values)
        yield
    finally:
        _set_env(old)


def _set_env(values: Mapping[str, str | None]) -> None:
    """Set each variable of ``values``; remove those whose value is ``None``."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextmanager
def arctic_home(home: Path, **more: str | None) -> Iterator[Path]:
    """``ARCTIC_RL_HOME`` (where the local backend keeps run dirs and tokens) set to ``home``,
    with ``more`` variables, for the block; the earlier values come back at exit."""
    with swapped_env({"ARCTIC_RL_HOME": str(home), **more}):
        yield home


def client_with_token(config: ArcticRLClientConfig, token: str) -> ArcticRLClient:
    """A client that read ``token`` as its personal access token (``ARCTIC_RL_PAT``), which is
    unset again once the client holds it."""
    from arctic_platform.rl.client import ArcticRLClient

    with swapped_env({"ARCTIC_RL_PAT": token}):
        return ArcticRLClient(config, progress=False)


@contextmanager
def local_client(home: Path, config: ArcticRLClientConfig) -> Iterator[ArcticRLClient]:
    """A client of the local backend under its own ``ARCTIC_RL_HOME`` (so it launches its own
    server and Ray cluster); the server is shut down and the old home restored at exit."""
    from arctic_platform.rl.client import ArcticRLClient

    with arctic_home(home):
        client = ArcticRLClient(config, progress=False)
        try:
            yield client
        finally:
            client.shutdown()


def client_config(model: str, port: int | None = None, **fields: Any) -> ArcticRLClientConfig:
    """The usual test config of a local-backend client: ``http`` on 127.0.0.1:``port``, one
    logical GPU per job, no Ray auto-attach, no server log echo; ``fields`` override any of it
    (``comm_protocol="ray", host=None`` for the ray transport)."""
    from arctic_platform.rl.config import ArcticRLClientConfig

    values: dict[str, Any] = dict(
        model_name=model,
        comm_protocol="http",
        host="127.0.0.1",
        port=port,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
        ray_auto_attach=False,
        server_logs=False,
        startup_timeout=300,
        health_check_interval=0.25,  # the server and its jobs are seen ready 0.25 s after
        job_ready_timeout=600,
        training_config={"optimizer": {"lr": 1e-3}},
    )
    values.update(fields)
    return ArcticRLClientConfig(**values)


_SECOND_PROCESS = """
import json
from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
config = ArcticRLClientConfig.model_validate_json(open({config!r}).read())
c = ArcticRLClient(config, progress=False)
{body}
c.close()
print(json.dumps(result))
"""


def in_second_process(
    client: ArcticRLClient,
    body: str,
    folder: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> Any:
    """Run ``body`` in a new Python process where ``c`` is a client reconnected to ``client``'s
    jobs (through ``reconnect_config()``); ``body`` sets ``result``, which comes back from JSON."""
    import json
    import subprocess
    import sys
    import textwrap

    config_file = folder / "reconnect.json"
    config_file.write_text(client.reconnect_config().model_dump_json())
    program = _SECOND_PROCESS.format(config=str(config_file), body=textwrap.dedent(body).strip())
    out = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env if env is not None else os.environ),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
