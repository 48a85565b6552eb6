"""The plugin manager: finds plugins through entry points and records how each one loaded.

One broken plugin never stops the others: its import error, an unknown hook name or a
duplicate entry-point name is recorded on its ``PluginRecord`` and shown by
``arctic-rl plugins list``.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import traceback
from dataclasses import dataclass
from typing import Any, Literal

import pluggy

from arctic_platform.rl.plugins.hookspecs import (
    ENTRY_POINT_GROUP,
    HOOK_KINDS,
    PROJECT_NAME,
    ArcticRLHookSpecs,
)

logger = logging.getLogger(__name__)

ALLOW_ENV = "ARCTIC_RL_PLUGINS"
DENY_ENV = "ARCTIC_RL_DISABLE_PLUGINS"

PluginStatus = Literal["loaded", "failed", "disabled", "duplicate"]

# Plugins that ship inside core itself (not through an entry point).
CORE_PLUGINS: tuple[str, ...] = ("arctic_platform.rl.losses",)
CORE_DISTRIBUTION = "arctic-platform"


@dataclass
class PluginRecord:
    """How one plugin package fared: where it came from, and whether it loaded."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    status: PluginStatus
    error: str | None = None
    builtin: bool = False


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class ArcticRLPluginManager(pluggy.PluginManager):
    """A pluggy manager for the ``arctic_rl`` project with our own entry-point loader."""

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(ArcticRLHookSpecs)
        self.records: dict[str, PluginRecord] = {}

    def register_checked(self, plugin: Any, record: PluginRecord) -> bool:
        """Register ``plugin`` and verify its hooks; record the outcome instead of raising."""
        try:
            self.register(plugin, name=record.name)
        except Exception as exc:  # pluggy raises ValueError / PluginValidationError
            record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
            self.records[record.name] = record
            return False
        unknown = [
            caller.name for caller in (self.get_hookcallers(plugin) or []) if not caller.has_spec()
        ]
        if unknown:
            self.unregister(plugin)
            record.status = "failed"
            record.error = f"unknown hook(s) {sorted(unknown)}; known hooks: {sorted(HOOK_KINDS)}"
        else:
            record.status = "loaded"
        self.records[record.name] = record
        return record.status == "loaded"

    def load_core_plugins(self) -> None:
        """Register the plugins that live inside core (the built-in losses)."""
        import importlib

        version = _distribution_version(CORE_DISTRIBUTION)
        for module_name in CORE_PLUGINS:
            record = PluginRecord(
                name=module_name,
                value=module_name,
                distribution=CORE_DISTRIBUTION,
                version=version,
                status="loaded",
                builtin=True,
            )
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:
                record.status, record.error = "failed", _format_exc(exc)
                self.records[record.name] = record
                continue
            self.register_checked(module, record)

    def load_entrypoints(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load every plugin of ``group``, honouring the allow- and deny-list variables."""
        allow, deny = _env_list(ALLOW_ENV), _env_list(DENY_ENV)
        seen: dict[str, str] = {}
        for ep in sorted(md.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            record = PluginRecord(ep.name, ep.value, dist, version, status="loaded")
            keys = {ep.name, dist or ""}
            if ep.name in seen:
                if seen[ep.name] == f"{dist}:{ep.value}":
                    continue  # the same distribution seen twice on sys.path
                record.status = "duplicate"
                record.error = (
                    f"entry point {ep.name!r} is provided by both {seen[ep.name]!r} "
                    f"and '{dist}:{ep.value}'; the second one is ignored"
                )
                self.records[f"{ep.name} ({dist})"] = record
                logger.warning(record.error)
                continue
            seen[ep.name] = f"{dist}:{ep.value}"
            if (allow is not None and not keys & allow) or (deny is not None and keys & deny):
                record.status = "disabled"
                record.error = f"disabled by {ALLOW_ENV if allow is not None else DENY_ENV}"
                self.records[ep.name] = record
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                record.status, record.error = "failed", _format_exc(exc)
                self.records[ep.name] = record
                logger.warning("arctic_rl plugin %r failed to load: %s", ep.name, record.error)
                continue
            self.register_checked(plugin, record)
        self.check_pending()


def _distribution_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _format_exc(exc: BaseException) -> str:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return last


def new_plugin_manager(load_entrypoints: bool = True) -> ArcticRLPluginManager:
    """A fresh manager with the core plugins and (by default) every installed plugin."""
    pm = ArcticRLPluginManager()
    pm.load_core_plugins()
    if load_entrypoints:
        pm.load_entrypoints()
    return pm
