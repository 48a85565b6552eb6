"""The demo plugin: registers the ``arctic-rl demo`` command (nothing is imported until it runs)."""

from __future__ import annotations

from collections.abc import Iterator

from arctic_platform.rl.api import CommandSpec, hookimpl
from arctic_rl_demo.command import SUMMARY


@hookimpl
def arctic_rl_register_commands() -> Iterator[CommandSpec]:
    """``arctic-rl demo``."""
    yield CommandSpec(
        name="demo",
        summary=SUMMARY,
        configure_parser="arctic_rl_demo.command:configure_parser",
        action="arctic_rl_demo.command:run_command",
    )
