"""Where servers keep their state on this machine, and the private files in it (tokens)."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

HOME_ENV = "ARCTIC_RL_HOME"


def arctic_home() -> Path:
    """Root of Arctic RL's local state: ``$ARCTIC_RL_HOME`` or ``~/.cache/arctic_rl``."""
    root = os.environ.get(HOME_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "arctic_rl"


def server_run_dir(host: str | None, port: int | None, transport: str = "http") -> Path:
    """The run directory of the server a local backend runs for ``host:port``."""
    name = f"{transport}_{host or 'none'}_{port or 'none'}"
    return arctic_home() / "servers" / re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by the owner only (0600), replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def read_or_create_token(path: Path) -> str:
    """The bearer token stored at ``path``, creating a random one (0600) if there is none."""
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    write_private(path, token)
    return token
