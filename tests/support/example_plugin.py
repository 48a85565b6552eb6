"""The third-party example plugin (tests/example_plugin), pip-installed into a folder of its
own: the environment that makes a process find it by its entry point alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "example_plugin"


def install_example_plugin(target: Path) -> dict[str, str]:
    """pip-installs the example plugin into ``target``; returns ``os.environ`` with it first on
    ``PYTHONPATH`` (and no plugin allow- or deny-list)."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    pip += ["--no-build-isolation", "--target", str(target), str(EXAMPLE)]
    subprocess.run(pip, check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("ARCTIC_RL_PLUGINS", None)
    env.pop("ARCTIC_RL_DISABLE_PLUGINS", None)
    return env
