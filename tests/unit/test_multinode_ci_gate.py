"""The multi-node suite fails under CI where it cannot make namespaces; elsewhere it skips."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

MULTINODE = Path(__file__).resolve().parents[1] / "multinode"
REASON = "`ip netns add` fails here: Operation not permitted"


@pytest.fixture(scope="module")
def conftest() -> ModuleType:
    """tests/multinode/conftest.py as a plain module (it imports ``netns_cluster`` beside it)."""
    sys.path.insert(0, str(MULTINODE))
    try:
        spec = importlib.util.spec_from_file_location(
            "multinode_conftest", MULTINODE / "conftest.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(MULTINODE))


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes", " true "])
def test_under_ci_a_machine_without_namespaces_fails_the_suite_naming_the_reason(conftest, value):
    action, why = conftest.unavailable_outcome(REASON, {"CI": value})
    assert action == "fail"
    assert REASON in why and "CI=" in why


@pytest.mark.parametrize("environ", [{}, {"CI": ""}, {"CI": "false"}, {"CI": "0"}])
def test_outside_ci_it_skips_with_the_reason(conftest, environ):
    assert conftest.unavailable_outcome(REASON, environ) == ("skip", REASON)


@pytest.mark.parametrize("environ", [{}, {"CI": "true"}])
def test_a_machine_that_can_make_namespaces_runs_the_suite(conftest, environ):
    assert conftest.unavailable_outcome(None, environ) is None
