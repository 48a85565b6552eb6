"""The registry: every spec that the loaded plugins provide, looked up by kind and name."""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any

from arctic_platform.rl.errors import DuplicatePluginError, UnknownPluginError
from arctic_platform.rl.plugins.hookspecs import HOOK_KINDS
from arctic_platform.rl.plugins.manager import (
    ArcticRLPluginManager,
    PluginRecord,
    new_plugin_manager,
)
from arctic_platform.rl.plugins.specs import SPEC_TYPES, normalize_name


@dataclass(frozen=True)
class RegisteredSpec:
    """A spec together with the plugin that provided it."""

    kind: str
    spec: Any
    plugin: PluginRecord

    @property
    def key(self) -> str:
        role = getattr(self.spec, "role", None)
        return f"{self.spec.name}[{role}]" if role else self.spec.name


@dataclass(frozen=True)
class Conflict:
    """Two plugins that register the same name for the same kind (and role)."""

    kind: str
    key: str
    first: RegisteredSpec
    second: RegisteredSpec

    @property
    def message(self) -> str:
        a, b = self.first.plugin, self.second.plugin
        return (
            f"{self.kind} {self.key!r} is registered twice: by plugin {a.name!r} "
            f"(distribution {a.distribution}) and by plugin {b.name!r} "
            f"(distribution {b.distribution})"
        )


def _provider(pm: ArcticRLPluginManager, plugin: Any) -> PluginRecord:
    name = pm.get_name(plugin) or repr(plugin)
    return pm.records.get(name) or PluginRecord(name, name, None, None, "loaded")


class Registry:
    """Specs by kind; unknown names raise with the installed choices and a suggestion."""

    def __init__(self, pm: ArcticRLPluginManager) -> None:
        self.pm = pm
        self.specs: dict[str, dict[str, RegisteredSpec]] = {kind: {} for kind in SPEC_TYPES}
        self.conflicts: dict[tuple[str, str], Conflict] = {}
        for hook_name, kind in HOOK_KINDS.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                record = _provider(pm, impl.plugin)
                try:
                    produced = list(impl.function() or [])
                    for spec in produced:
                        if not isinstance(spec, SPEC_TYPES[kind]):
                            raise TypeError(
                                f"{hook_name} must yield {SPEC_TYPES[kind].__name__}, "
                                f"got {type(spec).__name__}"
                            )
                except Exception as exc:
                    record.status = "failed"
                    record.error = f"{hook_name}: {type(exc).__name__}: {exc}"
                    continue
                for spec in produced:
                    self._add(RegisteredSpec(kind, spec, record))

    def _add(self, entry: RegisteredSpec) -> None:
        table = self.specs[entry.kind]
        existing = table.get(entry.key)
        if existing is not None:
            self.conflicts[(entry.kind, entry.key)] = Conflict(
                entry.kind, entry.key, existing, entry
            )
            return
        table[entry.key] = entry

    def names(self, kind: str, role: str | None = None) -> list[str]:
        """Sorted names registered for ``kind`` (engines: for ``role`` when given)."""
        out = {
            e.spec.name
            for e in self.specs[kind].values()
            if role is None or getattr(e.spec, "role", None) == role
        }
        return sorted(out)

    def get(self, kind: str, name: str, role: str | None = None, field: str | None = None) -> Any:
        """The spec of ``kind`` called ``name``.

        Raises UnknownPluginError (with the installed names) or DuplicatePluginError."""
        key_name = normalize_name(name) if isinstance(name, str) and name.strip() else str(name)
        key = f"{key_name}[{role}]" if role else key_name
        conflict = self.conflicts.get((kind, key))
        if conflict is not None:
            raise DuplicatePluginError(conflict.message)
        entry = self.specs[kind].get(key)
        if entry is None:
            raise UnknownPluginError(self.unknown_message(kind, name, role, field))
        return entry.spec

    def unknown_message(
        self, kind: str, name: Any, role: str | None = None, field: str | None = None
    ) -> str:
        """'Unknown backend 'x' (config field backend). Installed: a, b. Did you mean 'a'?'"""
        label = f"{role} engine" if role else kind
        installed = self.names(kind, role)
        where = f" (config field {field})" if field else ""
        msg = f"Unknown {label} {name!r}{where}. Installed: {', '.join(installed) or 'none'}."
        if isinstance(name, str):
            close = difflib.get_close_matches(name.strip().lower(), installed, n=1, cutoff=0.6)
            if close:
                msg += f" Did you mean {close[0]!r}?"
        if not installed or kind != "loss":
            msg += " (A plugin providing it may not be installed: see `arctic-rl plugins list`.)"
        return msg

    def rows(self) -> list[dict[str, Any]]:
        """One row per spec and per failed plugin, for ``arctic-rl plugins list``."""
        rows: list[dict[str, Any]] = []
        conflicted = {(c.kind, c.key) for c in self.conflicts.values()}
        for kind, table in self.specs.items():
            for key, e in sorted(table.items()):
                status: str = "duplicate" if (kind, key) in conflicted else e.plugin.status
                if status == "loaded" and not e.spec.implemented:
                    status = "not implemented yet"
                error = self.conflicts[(kind, key)].message if (kind, key) in conflicted else None
                rows.append(
                    {
                        "name": e.spec.name,
                        "kind": kind,
                        "role": getattr(e.spec, "role", None),
                        "plugin": e.plugin.name,
                        "distribution": e.plugin.distribution,
                        "version": e.plugin.version,
                        "status": status,
                        "error": error or (e.plugin.error if e.plugin.status != "loaded" else None),
                        "description": e.spec.description,
                    }
                )
        for record in self.pm.records.values():
            if record.status != "loaded":
                rows.append(
                    {
                        "name": record.name,
                        "kind": "plugin",
                        "role": None,
                        "plugin": record.name,
                        "distribution": record.distribution,
                        "version": record.version,
                        "status": record.status,
                        "error": record.error,
                        "description": record.value,
                    }
                )
        return rows


_lock = threading.Lock()
_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use from the installed plugins."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry(new_plugin_manager())
        return _registry


def set_registry(registry: Registry | None) -> None:
    """Replace (or, with None, forget) the process-wide registry; tests use a fresh one."""
    global _registry
    with _lock:
        _registry = registry
