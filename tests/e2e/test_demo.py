"""Short runs of the README's main job, ``arctic-rl demo``, end to end on CPU, in both modes.

They check the files and fields a run writes (SFT → GRPO, held-out evaluations, versions
and staleness), not learning figures: the runs are far too short to learn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS, SFT_STEPS = 3, 2


def _demo(tmp_path: Path, *flags: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path / "demo"
    env = dict(os.environ, ARCTIC_RL_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    args = [sys.executable, "-m", "arctic_platform.rl.cli", "demo", "--quiet"]
    args += ["--steps", str(STEPS), "--sft-steps", str(SFT_STEPS), "--eval-every", "2"]
    args += ["--prompts-per-step", "4", "--samples-per-prompt", "4", "--output-dir", str(out)]
    done = subprocess.run([*args, *flags], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done


def _check_run(out: Path, done: subprocess.CompletedProcess[str], mode: str) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in records if r["phase"] == "sft"]
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["step"] for r in sft] == list(range(SFT_STEPS))
    assert all(r["loss"] > 0 for r in sft)
    assert [r["step"] for r in rl] == list(range(STEPS))
    # before SFT, after SFT, every 2 RL steps, final
    assert [r["rl_step"] for r in evals] == [-1, 0, 2, STEPS]
    for r in rl:
        assert 0.0 <= r["reward_mean"] <= 1.0
        assert {"sync_weights", "total"} <= set(r["seconds"])
    # each GRPO step synced one new version to the sampler (the SFT sync made the first)
    versions = [r["weight_version"] for r in rl]
    assert versions == list(range(versions[0], versions[0] + STEPS))
    for r in evals:
        assert 0.0 <= r["heldout_exact"] <= 1.0
    assert (out / "reward.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == mode
    assert summary["steps"] == STEPS and summary["sft_steps"] == SFT_STEPS
    assert summary["heldout_size"] >= 64
    for key in ("heldout_exact_after_sft", "heldout_exact_final"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["heldout_exact_after_sft"] == evals[1]["heldout_exact"]
    assert summary["heldout_exact_final"] == evals[-1]["heldout_exact"]
    assert summary["rl_steps_per_second"] > 0
    assert summary["sft_checkpoint"]
    assert "held-out exact match" in (out / "summary.md").read_text()
    assert "held-out exact match" in done.stdout
    return rl


def test_short_sync_demo_writes_curve_plot_and_summary(tmp_path):
    out, done = _demo(tmp_path)
    rl = _check_run(out, done, "sync")
    assert all(r["staleness"] == 0 for r in rl)
    assert all("generate" in r["seconds"] for r in rl)


def test_short_async_demo_bounds_staleness_and_reports_versions(tmp_path):
    out, done = _demo(tmp_path, "--async", "--max-staleness", "1")
    rl = _check_run(out, done, "async")
    assert rl[0]["staleness"] == 0  # the first rollout was made with the SFT weights
    assert all(0 <= r["staleness"] <= 1 for r in rl)
    for r in rl:
        oldest, newest = r["sampled_versions"]
        assert oldest <= newest <= r["weight_version"]
        assert {"wait_rollout", "generate_overlapped"} <= set(r["seconds"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_staleness"] == 1 and summary["staleness_max"] <= 1
