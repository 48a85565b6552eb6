"""The engines import DeepSpeed without its autotuner's ``import mlflow`` (a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("mlflow")

PROGRAM = """
import json, sys
from arctic_rl_engines import ds_env
ds_env.import_deepspeed()
after = {"deepspeed": "deepspeed" in sys.modules, "mlflow": "mlflow" in sys.modules}
import mlflow  # still importable afterwards
import deepspeed.autotuning.autotuner as autotuner
after["mlflow_later"] = mlflow.__name__ == "mlflow"
after["autotuner_mlflow"] = autotuner.has_mlflow
print(json.dumps(after))
"""


def test_deepspeed_is_imported_without_mlflow_which_stays_importable():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    after = json.loads(done.stdout.strip().splitlines()[-1])
    # mlflow and pandas cost 1.8 of DeepSpeed's 4.4 s of import in every engine process
    assert after == {
        "deepspeed": True,
        "mlflow": False,
        "mlflow_later": True,
        "autotuner_mlflow": False,
    }
