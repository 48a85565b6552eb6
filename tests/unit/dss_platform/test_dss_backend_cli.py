"""The dss-platform backend refuses to start without a token; ``platform serve`` errors."""

from __future__ import annotations

import json

import pytest

from arctic_platform.rl.cli import main
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.testing import free_port
from arctic_rl_dss.backend import DssConfigError, DssPlatformBackend, settings_from_env


def _config(**extra):
    return ArcticRLClientConfig(
        model_name="m", backend="dss-platform", host="127.0.0.1", port=free_port(), **extra
    )


def test_no_token_is_refused_before_any_call(monkeypatch):
    monkeypatch.delenv("ARCTIC_RL_PAT", raising=False)
    monkeypatch.delenv("ARCTIC_RL_PAT_FILE", raising=False)
    with pytest.raises(DssConfigError, match="ARCTIC_RL_PAT"):  # nothing listens on the port
        DssPlatformBackend().start(_config(training_gpus=1))


def test_the_token_file_variable_is_read(monkeypatch, tmp_path):
    monkeypatch.delenv("ARCTIC_RL_PAT", raising=False)
    monkeypatch.setenv("ARCTIC_RL_PAT_FILE", str(tmp_path / "missing"))
    with pytest.raises(DssConfigError, match="cannot read"):
        DssPlatformBackend().start(_config(training_gpus=1))


def test_a_config_without_gpus_or_job_ids_is_refused(monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_PAT", "x" * 20)
    with pytest.raises(DssConfigError, match="gpus"):
        DssPlatformBackend().start(_config(training_gpus=0, sampling_gpus=0, log_prob_gpus=0))


def test_poll_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_DSS_POLL_INITIAL", "0.1")
    monkeypatch.setenv("ARCTIC_RL_DSS_POLL_MAX", "2")
    settings = settings_from_env()
    assert (settings["poll"].initial, settings["poll"].factor, settings["poll"].maximum) == (
        0.1,
        1.25,
        2.0,
    )
    monkeypatch.setenv("ARCTIC_RL_DSS_POLL_MAX", "soon")
    with pytest.raises(DssConfigError, match="not a number"):
        settings_from_env()


def test_platform_serve_needs_a_backend_with_a_server(capsys, tmp_path):
    tokens = tmp_path / "t.json"
    tokens.write_text(json.dumps({"alice": "a" * 20}))
    assert main(["platform", "serve", "--tokens", str(tokens), "--backend", "local"]) == 2
    assert "has no platform server" in capsys.readouterr().err


def test_platform_serve_refuses_a_bad_tokens_file(capsys, tmp_path):
    tokens = tmp_path / "t.json"
    tokens.write_text(json.dumps({"alice": "short"}))
    assert main(["platform", "serve", "--tokens", str(tokens), "--port", str(free_port())]) == 2
    assert "at least" in capsys.readouterr().err
