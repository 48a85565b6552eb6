"""Run a test program with a multi-process vLLM engine in its own process; read its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Put before every program: ``engine_config(path, kv_cache_bytes, **gpus)`` builds its config.
_HEADER = """
from arctic_platform.rl.config import ArcticRLClientConfig


def engine_config(path, kv_cache_bytes, **gpus):
    return ArcticRLClientConfig(
        model_name=path, host="127.0.0.1", port=7000,
        vllm_config={"kv_cache_memory_bytes": kv_cache_bytes}, **gpus,
    )

"""

# Put after every program: ``main(model_path)`` returns the result, printed as a RESULT line.
_FOOTER = """

if __name__ == "__main__":
    import json as _json
    import sys as _sys

    print("RESULT " + _json.dumps(main(_sys.argv[1])))
"""


def run_engine_program(
    source: str, model: str, work_dir: Path, name: str = "program.py"
) -> dict[str, Any]:
    """Write ``source`` (defining ``main(model_path)``, which returns a JSON-able dict; it may
    call ``engine_config``) to ``work_dir/name``, run it with ``model`` under vLLM's multi-process
    mode, check that its engine ran outside the test's process (``result["in_process"] is
    False``) and return the result."""
    script = work_dir / name
    script.write_text(_HEADER + source + _FOOTER)
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
    result = dict(json.loads(lines[-1].removeprefix("RESULT ")))
    print(f"{name}: {result}")
    assert result["in_process"] is False
    return result
