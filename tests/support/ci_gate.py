"""Under ``CI`` (true/1/yes) a test skipped because a package could not be imported fails:
a broken install must turn CI red, not into skips and a green run. Elsewhere such a test
still skips (a developer machine without an optional extra)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import pytest

MISSING_IMPORT = "could not import"  # how pytest.importorskip words its skip


def ci_is_set(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CI`` says this is a CI run."""
    return environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _fail_missing_import(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and MISSING_IMPORT in str(report.longrepr) and ci_is_set():
        report.outcome = "failed"
        report.longrepr = (
            f"CI={os.environ['CI']}: a package the suite needs is missing (a skip would hide "
            f"it): {report.longrepr}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A module whose top-level ``importorskip`` skipped: failed under CI."""
    outcome = yield
    _fail_missing_import(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test (or its fixture) whose ``importorskip`` skipped: failed under CI."""
    outcome = yield
    _fail_missing_import(outcome.get_result())  # type: ignore[attr-defined]
