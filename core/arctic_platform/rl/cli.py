"""The ``arctic-rl`` command line: plugins, config checks, and (later) serve and demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from arctic_platform.rl import __version__

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


_SERVE_DEFAULTS = {
    "host": "127.0.0.1",
    "port": 7000,
    "transport": "http",
    "num_gpus": 1,
    "op_timeout": 900.0,
    "sync_timeout": 120.0,
}


def _serve_settings(args: argparse.Namespace) -> None:
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
    for name, default in _SERVE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, saved.get(name, default))
    if saved.get("num_gpus"):  # the resumed jobs need at least the GPUs they had
        args.num_gpus = max(int(args.num_gpus), int(saved["num_gpus"]))


def _serve(args: argparse.Namespace) -> int:
    import logging
    import os
    import signal

    from arctic_platform.rl.errors import ArcticRLError
    from arctic_platform.rl.network import is_loopback
    from arctic_platform.rl.plugins import get_registry
    from arctic_platform.rl.run_dirs import server_run_dir
    from arctic_platform.rl.server import RLServer

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        _serve_settings(args)
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get("ARCTIC_RL_TOKEN")
    if args.token_file:
        token = Path(args.token_file).read_text().strip() or None
    if token is None and not is_loopback(args.host):
        print(
            f"error: refusing to serve on non-loopback address {args.host} without a token "
            "(--token-file or ARCTIC_RL_TOKEN)",
            file=sys.stderr,
        )
        return 2
    spec = get_registry().get("transport", args.transport, field="--transport")
    serve = spec.load_server()
    run_dir = Path(args.run_dir) if args.run_dir else server_run_dir(args.host, args.port)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = {"host": args.host, "port": args.port, "transport": args.transport}
    if not spec.network_address:  # the transport hosts RLServer itself (e.g. a Ray actor)

        def _exit(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _exit)
        (run_dir / "server.pid").write_text(str(os.getpid()))
        try:
            serve(
                run_dir,
                num_gpus=args.num_gpus,
                ray_auto_attach=not args.no_ray_auto_attach,
                ray_address=args.ray_address,
                op_timeout=args.op_timeout,
                sync_timeout=args.sync_timeout,
                resume=args.resume is not None,
                settings=settings,
            )
        except ArcticRLError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            (run_dir / "server.pid").unlink(missing_ok=True)
        return 0
    server = RLServer(
        run_dir,
        num_gpus=args.num_gpus,
        ray_auto_attach=not args.no_ray_auto_attach,
        ray_address=args.ray_address,
        op_timeout=args.op_timeout,
        sync_timeout=args.sync_timeout,
        resume=args.resume is not None,
        settings=settings,
    )

    def _stop(signum: int, _frame: object) -> None:
        server.shutdown_requested.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    pid_file = run_dir / "server.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        server.start()
        # ray.init (inside start) puts its own SIGTERM handler in, which exits the process
        # with status 15 mid-shutdown; a signal here asks for our orderly stop instead.
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        serve(server, args.host, args.port, token)
    except ArcticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.close()
        if pid_file.exists() and pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
    return 0


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
    return int(
        serve(
            host=args.host,
            port=args.port,
            tokens_file=args.tokens,
            run_dir=args.run_dir,
            num_gpus=args.num_gpus,
            op_timeout=args.op_timeout,
            log_level=args.log_level,
        )
    )


def _demo(args: argparse.Namespace) -> int:
    from arctic_platform.rl.demo import DemoSettings, run_demo

    settings = DemoSettings(
        steps=args.steps,
        sft_steps=args.sft_steps,
        eval_every=args.eval_every,
        async_mode=args.async_mode,
        max_staleness=args.max_staleness,
        prompts_per_step=args.prompts_per_step,
        samples_per_prompt=args.samples_per_prompt,
        model_size=args.model_size,
        transport=args.transport,
        colocate=args.colocate,
        seed=args.seed,
        quiet=args.quiet,
        learning_rate=args.lr,
        sft_learning_rate=args.sft_lr,
        kl_coef=args.kl_coef,
    )
    if args.output_dir:
        settings.output_dir = Path(args.output_dir)
    summary = run_demo(settings)
    print(
        f"held-out exact match ({summary['heldout_size']} prompts, greedy): after SFT "
        f"{summary['heldout_exact_after_sft']:.3f}, final {summary['heldout_exact_final']:.3f} "
        f"(RL adds {summary['heldout_gain_from_rl']:+.3f}); {summary['mode']}, "
        f"{summary['rl_steps_per_second']:.2f} RL steps/s, {summary['total_seconds'] / 60:.1f} "
        f"min; plot: {settings.output_dir / 'reward.png'}"
    )
    return 0


def _config_reference(args: argparse.Namespace) -> int:
    from arctic_platform.rl.config_doc import readme_section

    print(readme_section())
    return 0


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
    serve.add_argument("--log-level", default="info")
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

    demo = sub.add_parser(
        "demo", help="SFT warm start then GRPO on a digit-reversal task, tiny model, on CPU"
    )
    demo.add_argument("--steps", type=int, default=80, help="GRPO steps (default 80)")
    demo.add_argument("--sft-steps", type=int, default=40, help="warm-start steps (default 40)")
    demo.add_argument(
        "--eval-every", type=int, default=10, help="held-out evaluation every N RL steps (0: end)"
    )
    demo.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="one-step off-policy: generate the next rollouts while a step trains",
    )
    demo.add_argument(
        "--max-staleness",
        type=int,
        default=1,
        help="with --async: rollouts at most this many weight versions old (default 1)",
    )
    demo.add_argument("--prompts-per-step", type=int, default=16)
    demo.add_argument("--samples-per-prompt", type=int, default=16)
    demo.add_argument("--model-size", choices=["tiny", "small"], default="tiny")
    demo.add_argument("--transport", default="http")
    demo.add_argument("--colocate", action="store_true")
    demo.add_argument("--output-dir", help="run directory (default: runs/demo-<time>)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate")
    demo.add_argument("--sft-lr", type=float, default=2e-3, help="warm-start learning rate")
    demo.add_argument("--kl-coef", type=float, default=0.0)
    demo.add_argument("--quiet", action="store_true")
    demo.set_defaults(handler=_demo)
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
