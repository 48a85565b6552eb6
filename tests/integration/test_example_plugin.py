"""A real third-party package, pip-installed, adds a backend, a loss and a tracker by entry point
alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.example_plugin import install_example_plugin


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """pip-installs tests/example_plugin into its own target dir; returns the env to use it."""
    return install_example_plugin(tmp_path_factory.mktemp("example-site"))


def test_config_accepts_the_example_backend_in_a_clean_process(installed_example):
    program = (
        "from arctic_platform.rl.config import ArcticRLClientConfig\n"
        "from arctic_platform.rl.plugins import get_registry\n"
        "c = ArcticRLClientConfig(backend='example', model_name='m', host='127.0.0.1')\n"
        "assert c.backend == 'example', c.backend\n"
        "assert get_registry().get('loss', 'example-loss').load().__name__ == 'make_loss'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        env=installed_example,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "ok"


def test_plugins_list_shows_the_example_plugin(installed_example):
    out = subprocess.run(
        [sys.executable, "-m", "arctic_platform.rl.cli", "plugins", "list", "--json"],
        env=installed_example,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {(r["kind"], r["name"]): r for r in json.loads(out)}
    backend = rows[("backend", "example")]
    assert backend["distribution"] == "arctic-rl-example-plugin"
    assert backend["version"] == "0.2.0" and backend["status"] == "loaded"
    assert rows[("loss", "example-loss")]["status"] == "loaded"
    assert rows[("tracker", "example-csv")]["status"] == "loaded"


def test_without_the_package_the_example_backend_is_unknown():
    program = (
        "from pydantic import ValidationError\n"
        "from arctic_platform.rl.config import ArcticRLClientConfig\n"
        "try:\n"
        "    ArcticRLClientConfig(backend='example', model_name='m')\n"
        "except ValidationError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout
    assert "Unknown backend 'example'" in out
