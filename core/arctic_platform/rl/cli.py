"""The ``arctic-rl`` command line: plugins, config, serve, platform, and the plugins' commands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl import __version__

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.plugins.specs import CommandSpec

Handler = Callable[[argparse.Namespace], int]


def _plugins_list(args: argparse.Namespace) -> int:
    from arctic_platform.rl.plugins import get_registry

    rows = get_registry().rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ["name", "kind", "role", "distribution", "version", "status", "error"]
    table = [[str(r.get(c) or "") for c in cols] for r in rows]
    widths = [
        max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)
    ]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())
    return 0


def load_config_file(path: Path) -> Any:
    """Read a JSON or YAML config file into plain data."""
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def _config_check(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from arctic_platform.rl.config import ArcticRLClientConfig

    path = Path(args.file)
    try:
        data = load_config_file(path)
    except FileNotFoundError:
        print(f"error: {path}: no such file", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"error: {path}: cannot parse ({exc})", file=sys.stderr)
        return 2
    if not isinstance(data, dict):
        print(
            f"error: {path}: expected a mapping of fields, got {type(data).__name__}",
            file=sys.stderr,
        )
        return 2
    try:
        config = ArcticRLClientConfig.model_validate(data)
    except ValidationError as exc:
        print(f"{path}: {exc.error_count()} error(s)", file=sys.stderr)
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(config)"
            print(f"  {loc}: {err['msg']}", file=sys.stderr)
        return 1
    print(f"{path}: valid")
    if args.verbose:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from arctic_platform.rl.server.process import run_serve

    return run_serve(args)


def _platform_serve(args: argparse.Namespace) -> int:
    """Run the platform server that the backend named by ``--backend`` registers."""
    import logging

    from arctic_platform.rl.errors import ArcticRLError
    from arctic_platform.rl.plugins import get_registry

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        serve = get_registry().get("backend", args.backend, field="--backend").load_server()
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    passed = ("host", "port", "run_dir", "num_gpus", "op_timeout", "log_level")
    return int(serve(tokens_file=args.tokens, **{name: getattr(args, name) for name in passed}))


def _prometheus(args: argparse.Namespace) -> int:
    """Run Prometheus on a run dir's metrics targets."""
    from arctic_platform.rl.errors import ArcticRLError
    from arctic_platform.rl.observe.prometheus import command, run

    run_dir = Path(args.run_dir)
    options = {name: getattr(args, name) for name in ("host", "port", "binary", "scrape_seconds")}
    try:
        argv = command(run_dir, **options)
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"prometheus on http://{args.host}:{args.port} scraping the run in {run_dir}", flush=True)
    return run(argv)


def _dashboard(args: argparse.Namespace) -> int:
    """Draw the shipped dashboard's panels from a running Prometheus into a PNG."""
    from arctic_platform.rl.observe.render import http_fetch, render

    counts = render(http_fetch(args.prometheus), Path(args.out), minutes=args.minutes)
    empty = [title for title, n in counts.items() if n == 0]
    print(f"{args.out}: {len(counts)} panels, {len(counts) - len(empty)} with data")
    if empty:
        print("no data: " + "; ".join(empty))
    return 0


def _config_reference(args: argparse.Namespace) -> int:
    from arctic_platform.rl.config_doc import readme_section

    print(readme_section())
    return 0


BUILTIN_COMMANDS = frozenset({"plugins", "config", "serve", "platform", "prometheus", "dashboard"})
"""Core's own commands; a plugin command with one of these names is ignored (with a warning)."""


def _refusal(message: str) -> Handler:
    def handler(_args: argparse.Namespace) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    return handler


def _plugin_action(spec: CommandSpec) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        from arctic_platform.rl.errors import PluginError

        try:
            action = spec.load_action()
        except PluginError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return int(action(args) or 0)

    return handler


def _add_plugin_commands(sub: Any) -> None:
    """One subcommand per ``CommandSpec`` the plugins register (``arctic_rl_register_commands``).

    A broken command (two plugins with its name, or a parser hook that fails) still appears,
    and running it says what is wrong; the other commands are unaffected.
    """
    from arctic_platform.rl.errors import ArcticRLError
    from arctic_platform.rl.plugins import get_registry

    registry = get_registry()
    for name in registry.names("command"):
        if name in BUILTIN_COMMANDS:
            print(f"warning: plugin command {name!r} ignored: a built-in command", file=sys.stderr)
            continue
        try:
            spec = registry.get("command", name)
            configure = spec.load_configure_parser()
        except ArcticRLError as exc:
            # no option prefix: whatever follows the name is taken, and the run says why not
            broken = sub.add_parser(name, help=f"(broken: {exc})", prefix_chars="\0")
            broken.add_argument("rest", nargs="*")
            broken.set_defaults(handler=_refusal(str(exc)))
            continue
        parser = sub.add_parser(name, help=spec.summary, description=spec.summary)
        handler = _plugin_action(spec)
        try:
            configure(parser)
        except Exception as exc:
            handler = _refusal(f"command {name!r}: its parser hook failed ({exc!r})")
        parser.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``arctic-rl`` with every subcommand."""
    parser = argparse.ArgumentParser(prog="arctic-rl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"arctic-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    plugins = sub.add_parser("plugins", help="installed plugins")
    psub = plugins.add_subparsers(dest="plugins_command", metavar="SUBCOMMAND")
    plist = psub.add_parser("list", help="every plugin: name, kind, distribution, status, error")
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(handler=_plugins_list)

    config = sub.add_parser("config", help="configuration files")
    csub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    check = csub.add_parser("check", help="validate a config file, printing every error")
    check.add_argument("file", help="a .json or .yaml file of ArcticRLClientConfig fields")
    check.add_argument("-v", "--verbose", action="store_true", help="print the resolved config")
    check.set_defaults(handler=_config_check)
    ref = csub.add_parser("reference", help="print the config reference (markdown)")
    ref.set_defaults(handler=_config_reference)

    serve = sub.add_parser("serve", help="run an Arctic RL server (jobs on Ray)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 7000)")
    serve.add_argument("--transport", help="a registered transport (default http)")
    serve.add_argument("--token-file", help="file holding the bearer token clients must send")
    serve.add_argument("--run-dir", help="state directory (default: under $ARCTIC_RL_HOME)")
    serve.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="bring back the jobs of the server that ran in RUN_DIR (same ids, from their "
        "latest checkpoints); its address, transport, token and GPU count are reused unless "
        "given (never fewer GPUs than it had)",
    )
    serve.add_argument(
        "--num-gpus", type=int, help="logical GPUs for a fresh Ray cluster in CPU mode (default 1)"
    )
    serve.add_argument(
        "--ray-address",
        help="attach to the Ray cluster at this address (host:port of its head) and run the "
        "jobs on its nodes; RAY_ADDRESS does the same unless --no-ray-auto-attach",
    )
    serve.add_argument(
        "--no-ray-auto-attach", action="store_true", help="always start a fresh Ray cluster"
    )
    serve.add_argument(
        "--op-timeout", type=float, help="seconds before an engine call times out (default 900)"
    )
    serve.add_argument(
        "--sync-timeout",
        type=float,
        help="seconds a weight sync waits for a peer or a bucket (default 120)",
    )
    serve.add_argument(
        "--no-metrics",
        action="store_true",
        help="export no Prometheus metrics from the server and its workers (ARCTIC_RL_METRICS=0)",
    )
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--log-file",
        help="send this process's output (and what Ray forwards) to this file, rotated by size "
        "(the local backend passes RUN_DIR/server.log); default: the terminal",
    )
    serve.add_argument(
        "--log-max-mb",
        type=float,
        help="with --log-file: rotate past this size (default $ARCTIC_RL_LOG_MAX_MB or 64)",
    )
    serve.add_argument(
        "--log-backups",
        type=int,
        help="with --log-file: rotated files kept (default $ARCTIC_RL_LOG_BACKUPS or 3)",
    )
    serve.set_defaults(handler=_serve)

    platform = sub.add_parser("platform", help="a multi-user platform server for a backend")
    platsub = platform.add_subparsers(dest="platform_command", metavar="SUBCOMMAND")
    pserve = platsub.add_parser(
        "serve", help="serve the platform API of a backend (default dss-platform) over jobs on Ray"
    )
    pserve.add_argument("--host", default="127.0.0.1", help="address to bind")
    pserve.add_argument("--port", type=int, default=8000)
    pserve.add_argument("--tokens", required=True, help="JSON file of users and their tokens")
    pserve.add_argument("--backend", default="dss-platform", help="a backend with a server")
    pserve.add_argument("--run-dir", help="state directory (default: under $ARCTIC_RL_HOME)")
    pserve.add_argument(
        "--num-gpus", type=int, default=4, help="logical GPUs for a fresh Ray cluster in CPU mode"
    )
    pserve.add_argument(
        "--op-timeout", type=float, default=900.0, help="seconds before an engine call times out"
    )
    pserve.add_argument("--log-level", default="info")
    pserve.set_defaults(handler=_platform_serve)

    prom = sub.add_parser(
        "prometheus",
        help="run Prometheus (the distribution's binary) scraping a running server's run dir",
    )
    prom.add_argument("--run-dir", required=True, help="the server's run dir (serve --run-dir)")
    prom.add_argument("--host", default="127.0.0.1", help="address Prometheus binds")
    prom.add_argument("--port", type=int, default=9090)
    prom.add_argument("--binary", help="the prometheus executable (default: from the PATH)")
    prom.add_argument("--scrape-seconds", type=float, default=5.0, help="scrape interval")
    prom.set_defaults(handler=_prometheus)

    board = sub.add_parser(
        "dashboard", help="draw the Grafana dashboard's panels from a Prometheus into a PNG"
    )
    board.add_argument("--prometheus", default="http://127.0.0.1:9090", help="its URL")
    board.add_argument("--out", default="arctic-rl-dashboard.png", help="the PNG to write")
    board.add_argument("--minutes", type=float, default=15.0, help="how far back")
    board.set_defaults(handler=_dashboard)

    _add_plugin_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``arctic-rl`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
