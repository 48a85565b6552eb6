"""Shared fixtures: a tiny local model built once per session, the session's live server
(``support.live``: started on first use, stopped after its last test), CPU-friendly env vars.

``tests/`` is on ``sys.path`` (pytest's rootdir-relative import of this conftest), so every
test folder imports the kit as ``support``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import live as shared_live
from support.ci_gate import pytest_make_collect_report, pytest_runtest_makereport
from support.lasting import release_after, until_last_use
from support.live import LiveServer

# Nothing in the suite may reach a model hub or send usage reports.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent

# a missing package fails the run under CI instead of skipping (support.ci_gate)
__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ~0.4 M-parameter random-init Llama with a locally trained tokenizer."""
    from arctic_platform.rl.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama"))


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers that place a test among the shared live server's tests."""
    config.addinivalue_line(
        "markers", f"{shared_live.FIRST}: runs before the other tests of the shared live server"
    )
    config.addinivalue_line(
        "markers", f"{shared_live.LAST}: runs after the other tests of the shared live server"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``live_first``/``live_last`` tests go right before/after the shared server's others."""
    shared_live.order(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test and its fixtures' teardown, close the shared servers and engines no later
    test uses (``support.lasting``): later tests do not share the machine with them."""
    yield
    release_after(item)


@pytest.fixture(scope="session")
def live(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The session's shared ``arctic-rl serve`` (http) with training, sampling and log-prob
    jobs; tests leave it running with its three jobs (``support.live``). It stops after the
    last test that uses it."""
    server = shared_live.start(tiny_model_path, tmp_path_factory.mktemp("live-home"))
    release = until_last_use("live", server.stop)
    yield server
    release()
