"""The agent demo, ``arctic-rl demo --task lookup``, end to end on CPU: openai-agents episodes
in agent sessions, GRPO from their trajectories, and what GRPO itself adds.

The run warm-starts on demonstrations of which ``MISTAKES`` add a remark to the value ("8862
is the value."), a habit the warm start imitates and that only the exact-match reward can
remove; so the score after the warm start is low while its samples already hold right
answers, and the gain is asserted over that score, not over the one before the warm start (a
GRPO that did nothing, or a lost weight sync, fails it). Measured: see the README's table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

STEPS, EVAL_EVERY, MISTAKES = 5, 5, 0.7


def test_the_lookup_agent_learns_to_call_the_tool_and_copy_its_value(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, ARCTIC_RL_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    args = [sys.executable, "-m", "arctic_platform.rl.cli", "demo", "--task", "lookup"]
    args += ["--steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--quiet"]
    args += ["--demo-mistakes", str(MISTAKES)]
    args += ["--output-dir", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]

    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in records if r["phase"] == "sft"]
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    short, full = summary["sft_short_steps"], summary["sft_steps"]
    assert [r["tool_block"] for r in sft] == [False] * short + [True] * full
    assert [r["rl_step"] for r in evals] == [-1, 0, *range(EVAL_EVERY, STEPS, EVAL_EVERY), STEPS]
    assert [r["step"] for r in rl] == list(range(STEPS))
    # every rollout ran through openai-agents to the end, and GRPO trained on trajectories
    assert summary["rollout_errors"] == 0
    assert sum(r["trained_rows"] for r in rl) > 0
    assert all(r["seconds"]["sync_weights"] > 0 for r in rl)
    # the warm start taught the call and the copy, and its habit: the right key, few exact
    # answers; GRPO's own part is the gain over that
    before, warm = summary["heldout_success_before_sft"], summary["heldout_success_after_sft"]
    final = summary["heldout_success_final"]
    assert before <= 0.05 and warm <= 0.5, summary
    assert evals[1]["heldout_key_right"] >= 0.8
    # 5 of the demo's 30 GRPO steps: 1.000 in the README's runs, 0.734 in one CI run on a
    # slower machine, so the end bound of this shortened run is 0.6; the gain bound is 0.3
    assert final >= 0.6 and final - warm >= 0.3, summary
    assert summary["heldout_gain_from_rl"] == final - warm
    assert evals[-1]["heldout_key_right"] >= 0.8  # the right key, not a lucky answer
    assert (out / "reward.png").stat().st_size > 10_000
    assert "held-out success after SFT" in (out / "summary.md").read_text()
    assert "held-out success (64 keys" in done.stdout
