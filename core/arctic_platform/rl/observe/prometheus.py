"""``arctic-rl prometheus``: a Prometheus server scraping a running Arctic RL server's run.

It reads the run dir's targets (``discovery``), so it follows the cluster's nodes as they come
and go; its data and config live in ``<run_dir>/prometheus``. Prometheus itself is the
distribution's package (Debian: ``apt-get install prometheus``) or any ``prometheus`` binary
on the PATH (``--binary``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from arctic_platform.rl.errors import InvalidRequestError, MissingDependencyError
from arctic_platform.rl.observe.discovery import TARGETS_FILE

DEFAULT_PORT = 9090


def config_text(targets: Path, scrape_seconds: float = 5.0) -> str:
    """A Prometheus config scraping every target listed in ``targets`` (refreshed every 5 s)."""
    interval = f"{scrape_seconds:g}s"
    return (
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        "  - job_name: arctic_rl\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}']\n"
        "        refresh_interval: 5s\n"
    )


def command(
    run_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    binary: str | None = None,
    scrape_seconds: float = 5.0,
    retention: str = "7d",
) -> list[str]:
    """Write the config under ``<run_dir>/prometheus`` and return the command line that runs
    Prometheus on it (a clear error when the run dir or the binary is missing)."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise InvalidRequestError(f"run dir {run_dir} does not exist (serve --run-dir)")
    found = shutil.which(binary or "prometheus")
    if found is None:
        raise MissingDependencyError(
            f"no Prometheus binary ({binary or 'prometheus'}) on the PATH: install the "
            "distribution's package (Debian/Ubuntu: apt-get install prometheus) or pass --binary"
        )
    home = run_dir / "prometheus"
    (home / "data").mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    config.write_text(config_text(run_dir / TARGETS_FILE, scrape_seconds))
    return [
        found,
        f"--config.file={config}",
        f"--web.listen-address={host}:{port}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--storage.tsdb.retention.time={retention}",
    ]


def run(argv: list[str]) -> int:
    """Run a Prometheus command line (``command``'s) in the foreground until it exits (Ctrl-C
    stops it)."""
    try:
        return subprocess.call(argv)
    except KeyboardInterrupt:
        return 0
