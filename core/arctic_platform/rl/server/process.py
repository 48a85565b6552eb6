"""The ``arctic-rl serve`` process: its settings, the token rule, the pid file, signals, serving.

``run_serve`` takes the parsed command line (``argparse.Namespace``) and runs one server until
a stop: either an ``RLServer`` behind a transport on host:port, or a transport that hosts the
``RLServer`` itself (e.g. a Ray actor). Transport-free: the transport's server side comes from
the plugin registry.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import ArcticRLError

SERVE_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 7000,
    "transport": "http",
    "num_gpus": 1,
    "op_timeout": 900.0,
    "sync_timeout": 120.0,
}
"""What ``arctic-rl serve`` uses for an option neither given nor saved by a resumed run."""

PID_FILE = "server.pid"


def fill_serve_settings(args: argparse.Namespace) -> None:
    """Fill unset serve options: from the job table with ``--resume RUN_DIR``, else defaults."""
    from arctic_platform.rl.server.job_table import JobTableError, load_table, state_path

    saved: dict[str, Any] = {}
    if args.resume is not None:
        if args.run_dir and Path(args.run_dir).resolve() != Path(args.resume).resolve():
            raise JobTableError("--resume RUN_DIR and --run-dir name different directories")
        args.run_dir = args.resume
        table = load_table(Path(args.resume))
        if table is None:
            raise JobTableError(
                f"nothing to resume: {state_path(Path(args.resume))} does not exist"
            )
        saved = table.server
        token = Path(args.resume) / "token"
        if args.token_file is None and token.exists():
            args.token_file = str(token)
    for name, default in SERVE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, saved.get(name, default))
    if saved.get("num_gpus"):  # the resumed jobs need at least the GPUs they had
        args.num_gpus = max(int(args.num_gpus), int(saved["num_gpus"]))


def read_token(token_file: str | None) -> str | None:
    """The bearer token: the file's stripped text when given, else ``ARCTIC_RL_TOKEN``."""
    if token_file:
        return Path(token_file).read_text().strip()
    return os.environ.get("ARCTIC_RL_TOKEN")


@contextlib.contextmanager
def pid_file(run_dir: Path) -> Iterator[Path]:
    """``run_dir/server.pid`` holds this process's id while the block runs (removed after,
    unless another process wrote its own id there meanwhile)."""
    path = run_dir / PID_FILE
    mine = str(os.getpid())
    path.write_text(mine)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == mine:
                path.unlink()


def on_signals(handler: Callable[[int, Any], None], *signums: int) -> None:
    """Install ``handler`` for each of ``signums`` (default SIGTERM and SIGINT)."""
    for signum in signums or (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def start_log_rotation(args: argparse.Namespace) -> str | None:
    """With ``--log-file``: fds 1 and 2 go to that file, rotated by size; Ray's worker logs
    rotate by the same bound. Returns why the options are refused, else ``None``."""
    from arctic_platform.rl.server.log_rotation import (
        RotatingOutput,
        default_backups,
        default_max_mb,
    )

    if getattr(args, "log_file", None) is None:
        return None
    try:
        max_mb = default_max_mb() if args.log_max_mb is None else args.log_max_mb
        backups = default_backups() if args.log_backups is None else args.log_backups
    except ValueError as exc:
        return f"ARCTIC_RL_LOG_MAX_MB / ARCTIC_RL_LOG_BACKUPS must be numbers ({exc})"
    if max_mb <= 0 or backups < 0:
        return f"--log-max-mb must be > 0 and --log-backups >= 0 (got {max_mb}, {backups})"
    max_bytes = max(1, int(max_mb * 1_000_000))
    # Ray rotates its workers' .out/.err files only when this is set (ray 2.x default_worker)
    os.environ.setdefault("RAY_ROTATION_MAX_BYTES", str(max_bytes))
    os.environ.setdefault("RAY_ROTATION_BACKUP_COUNT", str(max(backups, 1)))
    RotatingOutput(Path(args.log_file), max_bytes, backups).start()
    return None


def run_serve(args: argparse.Namespace) -> int:
    """Run ``arctic-rl serve`` with its parsed arguments; the exit status (2: refused)."""
    from arctic_platform.rl.network import token_rule_violation
    from arctic_platform.rl.plugins import get_registry
    from arctic_platform.rl.run_dirs import server_run_dir
    from arctic_platform.rl.server import RLServer

    refused_log = start_log_rotation(args)
    if refused_log is not None:
        print(f"error: {refused_log}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        fill_serve_settings(args)
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "no_metrics", False):  # this process and the workers it starts
        os.environ["ARCTIC_RL_METRICS"] = "0"
    token = read_token(args.token_file)
    refusal = token_rule_violation(args.host, token)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    spec = get_registry().get("transport", args.transport, field="--transport")
    serve = spec.load_server()
    run_dir = Path(args.run_dir) if args.run_dir else server_run_dir(args.host, args.port)
    run_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "num_gpus": args.num_gpus,
        "ray_auto_attach": not args.no_ray_auto_attach,
        "ray_address": args.ray_address,
        "op_timeout": args.op_timeout,
        "sync_timeout": args.sync_timeout,
        "resume": args.resume is not None,
        "settings": {"host": args.host, "port": args.port, "transport": args.transport},
    }
    try:
        if not spec.network_address:  # the transport hosts RLServer itself
            on_signals(_exit_on_signal, signal.SIGTERM)
            with pid_file(run_dir):
                serve(run_dir, token=token, **options)
            return 0
        server = RLServer(run_dir, **options)

        def _stop(signum: int, _frame: object) -> None:
            server.shutdown_requested.set()

        on_signals(_stop)
        with pid_file(run_dir):
            try:
                server.start()
                # ray.init (inside start) puts its own SIGTERM handler in, which exits the
                # process with status 15 mid-shutdown; a signal asks for our orderly stop.
                on_signals(_stop)
                serve(server, args.host, args.port, token)
            finally:
                server.close()
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
