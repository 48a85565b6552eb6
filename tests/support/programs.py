"""Test programs in a Python process of their own (``python -c PROGRAM ARGS``) that print
their answer as one ``RESULT <json>`` line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

RESULT = "RESULT "


def run_ray_program(
    program: str, args: Sequence[str], env: Mapping[str, str], timeout: float
) -> tuple[Any, str]:
    """Run ``program`` with ``args`` and ``env`` plus a Ray temp dir of its own
    (``ARCTIC_RL_RAY_TMP``, removed after); its ``RESULT`` line's value and its stderr."""
    ray_tmp = tempfile.mkdtemp(prefix="arl-", dir="/tmp")  # Ray's socket paths must be short
    try:
        done = subprocess.run(
            [sys.executable, "-c", program, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "ARCTIC_RL_RAY_TMP": ray_tmp},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    assert out, done.stderr[-4000:]
    return json.loads(out[0][len(RESULT) :]), done.stderr
