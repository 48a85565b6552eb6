"""Records which plugin's implementation of which hook ran, for the hook-spec meta-test.

Every ``ArcticRLPluginManager`` made during the session wraps the hook implementations of
each plugin it registers, so a call through the manager (``pm.hook.<name>`` or the
registry's per-implementation calls) is noted as ``(hook, plugin name)``. The meta-test
``test_every_hook_is_called_through_the_plugin_manager`` runs last and reads the record.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import pytest

HOOK_CALLS: set[tuple[str, str]] = set()
"""``(hook name, plugin name)`` for every hook implementation that ran in this session."""
DUMP_ENV = "ARCTIC_RL_HOOK_CALLS_FILE"  # where a sub-session writes its record (JSON)
META_TEST = "test_every_hook_is_called_through_the_plugin_manager"


def _recording(function: Any, hook: str, plugin: str) -> Any:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        HOOK_CALLS.add((hook, plugin))
        return function(*args, **kwargs)

    call.__arctic_rl_recorded__ = True  # type: ignore[attr-defined]
    return call


def pytest_configure(config: pytest.Config) -> None:
    """Wrap the hook implementations of every plugin a manager registers."""
    from arctic_platform.rl.plugins.manager import ArcticRLPluginManager

    if getattr(ArcticRLPluginManager.register, "__arctic_rl_recorded__", False):
        return
    original = ArcticRLPluginManager.register

    @functools.wraps(original)
    def register(self: ArcticRLPluginManager, plugin: Any, name: str | None = None) -> Any:
        registered = original(self, plugin, name=name)
        plugin_name = self.get_name(plugin) or repr(plugin)
        for caller in self.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                recorded = getattr(impl.function, "__arctic_rl_recorded__", False)
                if impl.plugin is plugin and not recorded:
                    impl.function = _recording(impl.function, caller.name, plugin_name)
        return registered

    register.__arctic_rl_recorded__ = True  # type: ignore[attr-defined]
    ArcticRLPluginManager.register = register  # type: ignore[method-assign]


@pytest.fixture
def hook_call_record() -> tuple[set[tuple[str, str]], str]:
    """This session's ``(hook, plugin)`` record, and the variable that asks a sub-session to
    write its own."""
    return HOOK_CALLS, DUMP_ENV


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the meta-test to the end, after every test that may call a hook."""
    last = [item for item in items if item.name == META_TEST]
    items[:] = [item for item in items if item.name != META_TEST] + last


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the record where a parent meta-test asked for it."""
    path = os.environ.get(DUMP_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(sorted(HOOK_CALLS), f)
