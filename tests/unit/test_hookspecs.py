"""Meta-tests: every hook spec is documented with an example, and has a test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from arctic_platform.rl.plugins.hookspecs import HOOK_KINDS, ArcticRLHookSpecs

HOOKS = [name for name, _ in inspect.getmembers(ArcticRLHookSpecs) if name.startswith("arctic_rl_")]
TEST_TEXT = (
    "\n".join(
        p.read_text()
        for p in (Path(__file__).parent).rglob("*.py")
        if p.name != Path(__file__).name
    )
    + (Path(__file__).parents[1] / "example_plugin" / "arctic_rl_example" / "plugin.py").read_text()
)


def test_hook_kinds_cover_every_hook():
    assert sorted(HOOKS) == sorted(HOOK_KINDS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_docstring_with_example(hook):
    doc = inspect.getdoc(getattr(ArcticRLHookSpecs, hook)) or ""
    assert "Example::" in doc and "@hookimpl" in doc


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_implemented_by_a_test_fixture_or_the_example_plugin(hook):
    site = Path(__file__).parent / "plugins" / "data" / "site"
    fixtures = "\n".join(p.read_text() for p in site.glob("*.py"))
    implemented = hook in fixtures or hook in TEST_TEXT
    assert implemented, f"{hook} has no test plugin implementing it"
