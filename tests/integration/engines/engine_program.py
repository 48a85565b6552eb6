"""Run a test program with a multi-process vLLM engine in its own process; read its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_engine_program(source: str, model: str, work_dir: Path, name: str) -> dict[str, Any]:
    """Write ``source`` to ``work_dir/name``, run it with ``model`` under vLLM's multi-process
    mode, and return the JSON of its last ``RESULT `` line (its stderr on failure)."""
    script = work_dir / name
    script.write_text(source)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), model],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))
