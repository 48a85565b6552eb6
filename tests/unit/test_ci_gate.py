"""The CI gate: an importorskip of a missing package fails a CI run (at collection and inside
a test) and still skips elsewhere; run on throw-away test files in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
FILES = {
    "test_module_level.py": "import pytest\npytest.importorskip('no_such_pkg_xyz')\n\n"
    "def test_never():\n    pass\n",
    "test_in_a_test.py": "import pytest\n\ndef test_inside():\n"
    "    pytest.importorskip('no_such_pkg_xyz')\n\n"
    "def test_a_plain_skip():\n    pytest.skip('not a missing package')\n",
}


def _run(tmp_path: Path, ci: str | None, name: str) -> str:
    (tmp_path / name).write_text(FILES[name])
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(TESTS)
    args = [sys.executable, "-m", "pytest", "-p", "support.ci_gate", "-p", "no:cacheprovider"]
    args += ["-q", "-rfEs", "--rootdir", str(tmp_path), "-c", os.devnull, name]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env)
    return done.stdout + done.stderr


@pytest.mark.parametrize("ci", ["true"])
def test_under_ci_a_missing_package_fails_where_it_would_skip(tmp_path, ci):
    # at collection: the run stops with the error (pytest's rule for collection errors)
    out = _run(tmp_path, ci, "test_module_level.py")
    assert "1 error" in out and "a package the suite needs is missing" in out, out
    # inside a test: that test fails, a plain skip stays a skip
    out = _run(tmp_path, ci, "test_in_a_test.py")
    assert "1 failed, 1 skipped" in out, out
    assert "a package the suite needs is missing" in out, out


@pytest.mark.parametrize("ci", [None])
def test_elsewhere_a_missing_package_still_skips(tmp_path, ci):
    assert "1 skipped" in _run(tmp_path, ci, "test_module_level.py")
    assert "2 skipped" in _run(tmp_path, ci, "test_in_a_test.py")
