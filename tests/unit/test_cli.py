"""The ``arctic-rl`` command line: version, plugins list, config check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from arctic_platform.rl import __version__
from arctic_platform.rl.cli import main


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_plugins_list_json_has_every_column(capsys):
    assert main(["plugins", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["kind"], r["name"]) for r in rows}
    assert {
        ("backend", "local"),
        ("backend", "dss-platform"),
        ("transport", "http"),
        ("transport", "ray"),
        ("engine", "vllm"),
        ("engine", "deepspeed"),
    } <= names
    for row in rows:
        assert {"name", "kind", "distribution", "version", "status", "error"} <= set(row)


def test_plugins_list_table(capsys):
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["NAME", "KIND"]
    assert "dss-platform" in out


def test_config_check_accepts_a_valid_yaml(tmp_path, capsys):
    f = tmp_path / "ok.yaml"
    f.write_text("model_name: m\ntraining_gpus: 1\nhost: 127.0.0.1\n")
    assert main(["config", "check", str(f)]) == 0
    assert "valid" in capsys.readouterr().out


def test_config_check_prints_every_error_at_once(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(
        json.dumps(
            {
                "model_name": "m",
                "training_gpus": -1,
                "backend": "dss-platfrom",
                "startup_timeout": 0,
                "colocate": "sometimes",
            }
        )
    )
    assert main(["config", "check", str(f)]) == 1
    err = capsys.readouterr().err
    assert "4 error(s)" in err
    for field in ("training_gpus", "backend", "startup_timeout", "colocate"):
        assert f"  {field}:" in err
    assert "dss-platform" in err


def test_config_check_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["config", "check", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_config_check_unparsable_file_is_exit_2(tmp_path, capsys):
    f = tmp_path / "broken.json"
    f.write_text("{not json")
    assert main(["config", "check", str(f)]) == 2
    assert "cannot parse" in capsys.readouterr().err


def test_console_script_runs_in_a_subprocess():
    out = subprocess.run(
        [sys.executable, "-m", "arctic_platform.rl.cli", "plugins", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any(r["name"] == "local" for r in json.loads(out))
