"""The mutation set-up itself, on one small module, so it cannot rot between full runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("run_mutation.py")


def test_the_weight_sync_schedule_meets_the_mutation_goal(tmp_path: Path):
    scores = tmp_path / "scores.json"
    stage = tmp_path / "stage"
    done = subprocess.run(
        [
            sys.executable,
            str(RUNNER),
            "schedule",
            "--stage-root",
            str(stage),
            "--json",
            str(scores),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (score,) = json.loads(scores.read_text())
    assert score["module"] == "schedule"
    assert score["total"] >= 80, score  # the module was really mutated, not skipped
    assert score["percent"] >= 85.0, done.stdout
