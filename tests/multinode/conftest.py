"""Fixtures for tests on a multi-node Ray cluster made of network namespaces on this machine.

Every test in this directory is marked ``multinode`` and ``slow`` (it starts Ray clusters).
``netns_cluster`` is one cluster for the session (a GPU-less head, ``ARL_NETNS_WORKERS``
one-GPU workers, default 4, and one client namespace); ``netns_cluster_factory`` makes
clusters a test may break (kill a node, cut a link), closed when the test ends. Where the
machine cannot make namespaces (not root, no ``ip``) both skip with the reason, except under
``CI=true``, where they fail: a CI run that silently skips the suite would pass untested.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from netns_cluster import NetnsCluster, unavailable_reason
from support.ci_gate import ci_is_set
from support.lasting import until_last_use

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under this directory ``multinode`` and ``slow``."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.multinode)
            item.add_marker(pytest.mark.slow)


def unavailable_outcome(reason: str | None, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """What the suite does when namespaces cannot be made (``reason``): None when they can,
    ``("fail", why)`` under ``CI`` set to true/1/yes, else ``("skip", reason)``."""
    if reason is None:
        return None
    if ci_is_set(environ):
        return "fail", f"CI={environ['CI']} but the multi-node suite cannot run here: {reason}"
    return "skip", reason


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip (with the reason) where namespaces, veth pairs or bridges cannot be made; CI fails."""
    outcome = unavailable_outcome(unavailable_reason(), os.environ)
    if outcome is not None:
        action, why = outcome
        if action == "fail":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    # a SIGTERM (a CI timeout) becomes SystemExit, so fixtures' finally and atexit clean up
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@pytest.fixture(scope="session")
def netns_cluster(netns_available: None) -> Iterator[NetnsCluster]:
    """A session-wide cluster: head (no GPUs) + N one-GPU workers + 1 client namespace; closed
    after the last test that uses it (``support.lasting``), not at the end of the session."""
    workers = int(os.environ.get("ARL_NETNS_WORKERS", "4"))
    cluster = NetnsCluster(workers=workers, clients=1)
    release = until_last_use("netns_cluster", cluster.close)  # after its last test
    try:
        cluster.start()
        yield cluster
    finally:
        release()


@pytest.fixture
def netns_cluster_factory(netns_available: None) -> Iterator[Callable[..., NetnsCluster]]:
    """Make started clusters (``NetnsCluster`` keyword arguments); all closed after the test."""
    made: list[NetnsCluster] = []

    def make(**kwargs: Any) -> NetnsCluster:
        cluster = NetnsCluster(**kwargs)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        errors = []
        for cluster in made:
            try:
                cluster.close()
            except Exception as exc:  # close the others first
                errors.append(exc)
        if errors:
            raise errors[0]
