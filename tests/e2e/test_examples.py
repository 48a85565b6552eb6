"""The examples a user copies run as written and show what they promise.

``examples/grpo_loop.py`` must print, every step, the mean reward, the held-out score and the
weight version the sampler serves, and a short run must visibly learn (its seeded reward
climbs from about 0.05 to about 0.3 within a dozen steps on the tiny model).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.tracker_readers import read_tensorboard

from arctic_platform.rl.network import free_port

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEP_LINE = re.compile(
    r"^step (\d+): reward ([0-9.]+)  held-out ([0-9.]+)  weight_version (\d+)$", re.M
)
STEPS = 12


def test_grpo_loop_prints_reward_held_out_and_version_and_learns(
    tiny_model_path: str, tmp_path: Path
) -> None:
    env = dict(os.environ, ARCTIC_RL_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    args = [sys.executable, str(EXAMPLES / "grpo_loop.py"), "--model", tiny_model_path]
    args += ["--steps", str(STEPS), "--port", str(free_port())]
    args += ["--report-to", "tensorboard", "--log-dir", str(tmp_path / "run")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]

    assert re.search(r"^before training: held-out [0-9.]+$", done.stdout, re.M), done.stdout
    rows = [(int(s), float(r), float(h), int(v)) for s, r, h, v in STEP_LINE.findall(done.stdout)]
    assert [row[0] for row in rows] == list(range(1, STEPS + 1)), done.stdout
    for _, reward, held_out, _ in rows:
        assert 0.0 <= reward <= 1.0 and 0.0 <= held_out <= 1.0
    versions = [row[3] for row in rows]
    assert versions == list(range(versions[0], versions[0] + STEPS)), "one sync a step"
    first = sum(row[1] for row in rows[:4]) / 4
    last = sum(row[1] for row in rows[-4:]) / 4
    assert last > first + 0.05, f"reward did not climb: first four {first:.3f}, last {last:.3f}"

    # --report-to: the printed figures and the platform's answers, at each step, in TensorBoard
    series = read_tensorboard(tmp_path / "run" / "tensorboard")
    for key, column in (("reward_mean", 1), ("held_out", 2), ("sync/weight_version", 3)):
        assert [s for s, _ in series[key]] == [row[0] for row in rows], key
        for (_, value), row in zip(series[key], rows, strict=True):
            assert abs(value - row[column]) <= 5e-4, (key, value, row)  # printed to 3 places
    trained_steps = {s for s, _ in series["train/loss"]}
    assert trained_steps and trained_steps <= {row[0] for row in rows}
    for key in (
        "train/mismatch_k3",
        "train/compute_seconds",
        "train/batch_tokens",
        "optim/grad_norm",
        "generate/completion_tokens",
        "sync/bytes",
    ):
        assert key in series, (key, sorted(series))  # fmt: skip
