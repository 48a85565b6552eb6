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
