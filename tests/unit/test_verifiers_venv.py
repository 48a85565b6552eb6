"""The helper that builds ``.venv-verifiers`` (``support.verifiers_venv``), without pip: it
builds once per pinned spec, rebuilds when the pin changes, and a failing command is an error
carrying that command's output (the test that needs the venv then fails, never skips)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support import verifiers_venv
from support.verifiers_venv import COMPILE


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The venv moved to a temp dir and its build commands recorded, not run (``venv``
    makes the interpreter file, as the real one would)."""
    venv = tmp_path / "venv-verifiers"
    monkeypatch.setenv(verifiers_venv.VENV_ENV, str(venv))
    calls: list[list[str]] = []

    def fake_run(args: list[str]) -> None:
        calls.append(args)
        if args[1:3] == ["-m", "venv"]:
            python = verifiers_venv.venv_python(venv)
            python.parent.mkdir(parents=True, exist_ok=True)
            python.write_text("")

    monkeypatch.setattr(verifiers_venv, "_run", fake_run)
    return calls


def test_it_builds_once_per_pin_and_again_when_the_pin_changes(builds, monkeypatch):
    python = verifiers_venv.ensure()
    assert python == verifiers_venv.venv_python()
    assert [call[1:3] for call in builds] == [["-m", "venv"], ["-m", "pip"], ["-c", COMPILE]]
    assert builds[1][-1] == verifiers_venv.SPEC
    assert verifiers_venv.is_current()

    assert verifiers_venv.ensure() == python
    assert len(builds) == 3  # the stamp matched: nothing ran

    monkeypatch.setattr(verifiers_venv, "SPEC", "verifiers==9.9.9")
    assert not verifiers_venv.is_current()
    verifiers_venv.ensure()
    assert len(builds) == 6 and builds[-2][-1] == "verifiers==9.9.9"


def test_a_failed_command_is_an_error_with_its_output():
    failing = [sys.executable, "-c", "print('no matching distribution'); raise SystemExit(3)"]
    with pytest.raises(verifiers_venv.VenvBuildError, match="no matching distribution"):
        verifiers_venv._run(failing)


def test_main_fails_and_leaves_no_stamp_when_pip_fails(builds, monkeypatch, capsys):
    def pip_fails(args: list[str]) -> None:
        if args[1:3] == ["-m", "pip"]:
            raise verifiers_venv.VenvBuildError("pip install exited with 1:\nresolver said no")

    monkeypatch.setattr(verifiers_venv, "_run", pip_fails)
    assert verifiers_venv.main() == 1
    assert "resolver said no" in capsys.readouterr().err
    assert not verifiers_venv.is_current()
