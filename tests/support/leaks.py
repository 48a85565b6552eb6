"""Find secrets (tokens) written to files: every file under some folders, read as bytes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path


def files_holding(
    secrets: Mapping[str, str],
    roots: Iterable[Path],
    skip: Callable[[Path], bool] = lambda path: False,
) -> list[str]:
    """``'<secret name> in <file>'`` for each file under ``roots`` (recursively; a file reached
    twice through links is read once) that holds a secret, except where ``skip(path)``.

    Every root must be an existing folder and every secret a non-empty string, so a scan
    cannot pass by reading nothing or by looking for nothing.
    """
    empty = [name for name, value in secrets.items() if not value]
    assert not empty, f"empty secrets {empty}: the scan would pass without looking for them"
    assert secrets, "no secrets given: the scan would pass without looking for any"
    found: list[str] = []
    seen: set[Path] = set()
    wanted = {name: value.encode() for name, value in secrets.items()}
    for root in roots:
        assert root.is_dir(), f"{root} is missing: the scan would pass without reading it"
        for path in sorted(root.rglob("*")):
            real = path.resolve()
            if real in seen or skip(real) or not real.is_file():
                continue
            seen.add(real)
            try:
                data = real.read_bytes()
            except OSError:  # gone meanwhile (a rotated log)
                continue
            found += [f"{name} in {path}" for name, value in wanted.items() if value in data]
    return found


def ray_session_logs(server_pid: int) -> list[Path]:
    """The ``logs`` folder of each Ray session of the local cluster a server process started
    (``ray_cluster``: ``$ARCTIC_RL_RAY_TMP/arctic-rl-ray-<pid>``, default under /tmp); at
    least one, holding files."""
    temp = Path(os.environ.get("ARCTIC_RL_RAY_TMP", "/tmp")) / f"arctic-rl-ray-{server_pid}"
    logs = sorted({p.resolve() for p in temp.glob("session_*/logs")})
    assert logs and any(p.is_file() for p in logs[0].rglob("*")), f"no Ray session logs in {temp}"
    return logs
