"""A short run of the README's main job, ``arctic-rl demo``, end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_short_demo_writes_metrics_plot_and_summary(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, ARCTIC_RL_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "arctic_platform.rl.cli",
            "demo",
            "--steps",
            "3",
            "--quiet",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records:
        assert 0.0 <= r["reward_mean"] <= 1.0
        assert set(r["seconds"]) >= {"generate", "log_probs", "step", "sync_weights", "total"}
    assert records[-1]["weight_version"] == 2  # each step synced the new weights
    assert (out / "reward.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert "mean reward" in done.stdout
