"""Meta-tests: every hook spec is documented with an example, and a test calls it."""

from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arctic_platform.rl.plugins.hookspecs import ENTRY_POINT_GROUP, HOOK_KINDS, ArcticRLHookSpecs

PLUGIN_TEST_FILES = ("test_plugin_manager.py",)  # the tests that drive plugins through a manager
HOOKS = [name for name, _ in inspect.getmembers(ArcticRLHookSpecs) if name.startswith("arctic_rl_")]


def test_hook_kinds_cover_every_hook():
    assert sorted(HOOKS) == sorted(HOOK_KINDS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_docstring_with_example(hook):
    doc = inspect.getdoc(getattr(ArcticRLHookSpecs, hook)) or ""
    assert "Example::" in doc and "@hookimpl" in doc


def _hook_calls_of_the_plugin_tests(
    session: pytest.Session, record: tuple[set[tuple[str, str]], str], tmp_path: Path
) -> set[tuple[str, str]]:
    """This session's record if it ran the plugin tests; else that of a sub-session that runs
    them."""
    calls, dump_env = record
    unit = Path(__file__).parent
    files = {unit / name for name in PLUGIN_TEST_FILES}
    if files <= {Path(item.path) for item in session.items}:
        return set(calls)
    dump = tmp_path / "hook-calls.json"
    env = dict(os.environ, **{dump_env: str(dump)})
    args = ["-q", "-p", "no:cacheprovider", "-x"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *map(str, sorted(files)), *args],
        env=env,
        cwd=unit.parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {(hook, plugin) for hook, plugin in json.loads(dump.read_text())}


def test_every_hook_is_called_through_the_plugin_manager(
    request: pytest.FixtureRequest, hook_call_record, tmp_path: Path
):
    """Each hook spec had a test plugin's implementation called through a plugin manager
    (not merely its name written in a test file). Runs last (tests/unit/conftest.py)."""
    from arctic_platform.rl.plugins.manager import CORE_PLUGINS

    builtin = {
        ep.name
        for ep in md.entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == "arctic-platform"
    } | set(CORE_PLUGINS)
    calls = _hook_calls_of_the_plugin_tests(request.session, hook_call_record, tmp_path)
    by_test_plugins = {hook for hook, plugin in calls if plugin not in builtin}
    missing = sorted(set(HOOKS) - by_test_plugins)
    assert not missing, (
        f"no test called {missing} of a test plugin through the plugin manager; "
        f"calls seen: {sorted(calls)}"
    )
