"""Runs of the README's main job, ``arctic-rl demo``, end to end on CPU, in both modes.

A short synchronous run checks the files and fields a run writes (SFT → GRPO, held-out
evaluations, versions, no staleness, no overlap). A budget ``--async`` run (the demo's warm
start and batch sizes, ``ASYNC_STEPS`` GRPO steps) checks the pipeline's schedule (the
staleness of every step), that generation overlapped training, that rollouts spanning a
hotswap are counted and bounded, and what GRPO itself adds: the warm start learns reversal
and imitates its demonstrator's habit (a full stop after the digits, which the exact-match
reward refuses), so the held-out score after it is low, and the gain is asserted over that
score (a GRPO that did nothing, or a lost weight sync, fails it).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.example_plugin import install_example_plugin
from support.tracker_readers import (
    read_mlflow,
    read_tensorboard,
    read_wandb,
    wandb_run_file,
)

from arctic_rl_demo.run_log import tracker_step

pytestmark = pytest.mark.slow

STEPS, SFT_STEPS = 3, 2
SHORT = ["--steps", str(STEPS), "--sft-steps", str(SFT_STEPS), "--eval-every", "2"]
SHORT += ["--prompts-per-step", "4", "--samples-per-prompt", "4"]
# The budget run: the demo's warm start (200 steps, 70 % of demonstrations with the habit) and
# batch sizes, 20 GRPO steps (with a 40-step warm start and no habit, two runs on the shared
# 2-core machine saw hotswaps during a rollout in 6 and 3 of 20 steps, step 10 in both: the
# held-out evaluation after step 9 slows the rollouts in flight, so a sync lands inside one).
ASYNC_STEPS, ASYNC_SFT_STEPS, DEPTH = 20, 200, 2


def _demo(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path / "demo"
    env = dict(env or os.environ, ARCTIC_RL_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    args = [sys.executable, "-m", "arctic_platform.rl.cli", "demo", "--quiet"]
    args += ["--output-dir", str(out), *flags]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done


def _check_run(
    out: Path,
    done: subprocess.CompletedProcess[str],
    mode: str,
    steps: int = STEPS,
    sft_steps: int = SFT_STEPS,
    eval_every: int = 2,
) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in records if r["phase"] == "sft"]
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["step"] for r in sft] == list(range(sft_steps))
    assert all(r["loss"] > 0 for r in sft)
    assert [r["step"] for r in rl] == list(range(steps))
    # before SFT, after SFT, every eval_every RL steps, final
    assert [r["rl_step"] for r in evals] == [-1, 0, *range(eval_every, steps, eval_every), steps]
    for r in rl:
        assert 0.0 <= r["reward_mean"] <= 1.0
        assert {"sync_weights", "total"} <= set(r["seconds"])
    # each GRPO step synced one new version to the sampler (the SFT sync made the first)
    versions = [r["weight_version"] for r in rl]
    assert versions == list(range(versions[0], versions[0] + steps))
    for r in evals:
        assert 0.0 <= r["heldout_exact"] <= 1.0
    assert (out / "reward.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == mode
    assert summary["steps"] == steps and summary["sft_steps"] == sft_steps
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


def test_short_sync_demo_writes_curve_plot_and_summary_and_reports_to_four_trackers(tmp_path):
    # the three built-in trackers and a third-party one, installed by its entry point alone
    env = install_example_plugin(tmp_path / "example-site")
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    trackers = ["--report-to", "tensorboard,mlflow,wandb,example-csv"]
    out, done = _demo(tmp_path, *SHORT, *trackers, env=env)
    rl = _check_run(out, done, "sync")
    _check_trackers(out)
    assert all(r["staleness"] == 0 == r["launch_staleness"] for r in rl)
    assert all("generate" in r["seconds"] for r in rl)
    # every sample of step k came from the weights of step k - 1 (drained before the sync),
    # and nothing was generated while an update trained
    assert all(r["sampled_versions"] == [r["weight_version"] - 1] * 2 for r in rl)
    assert all(r["generation_overlap_seconds"] == 0 for r in rl)
    # each update measured the sampler/trainer mismatch: fresh fp32 weights on both sides
    measured = [r["mismatch_k3"] for r in rl if r["mismatch_k3"] is not None]
    assert measured and all(0.0 <= k3 < 1e-3 for k3 in measured), measured


def _check_trackers(out: Path) -> None:
    """Every tracker holds the run's figures at their steps, as ``metrics.jsonl`` has them."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        step = tracker_step(r, SFT_STEPS)
        for key, value in r.items():
            if key not in ("phase", "step", "rl_step") and isinstance(value, int | float):
                expected.setdefault(f"{r['phase']}/{key}", []).append((step, float(value)))
        for key, value in r.get("seconds", {}).items() if r["phase"] == "rl" else ():
            expected.setdefault(f"rl/seconds/{key}", []).append((step, float(value)))
    # the figures the summary prints, and the platform's own (mismatch, sync bytes)
    for key in ("eval/heldout_exact", "rl/reward_mean", "rl/mismatch_k3", "rl/sync_bytes"):
        assert key in expected, key
    csv_rows = list(csv.reader((out / "example-tracker.csv").open()))
    assert csv_rows[0] == ["run", "arctic-rl-demo", out.name]
    by_tracker = {
        "tensorboard": read_tensorboard(out / "tensorboard"),
        "mlflow": read_mlflow((out / "mlruns").resolve().as_uri(), "arctic-rl-demo")[0],
        "wandb": read_wandb(wandb_run_file(out))[0],
        "example-csv": _csv_series(csv_rows[1:]),
    }
    for tracker, series in by_tracker.items():
        assert set(series) == set(expected), (tracker, set(series) ^ set(expected))
        for key, rows in expected.items():
            got = series[key]
            if tracker == "wandb":  # one wandb row per step: the last value logged there
                rows = list(dict(rows).items())
            assert [s for s, _ in got] == [s for s, _ in rows], (tracker, key)
            for (_, a), (_, b) in zip(got, rows, strict=True):
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12), (tracker, key, a, b)


def _csv_series(rows: list[list[str]]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for step, name, value in rows:
        series.setdefault(name, []).append((int(step), float(value)))
    return series


def test_async_budget_demo_keeps_its_schedule_overlaps_bounds_hotswaps_and_learns(tmp_path):
    flags = ["--async", "--max-staleness", str(DEPTH), "--steps", str(ASYNC_STEPS)]
    flags += ["--sft-steps", str(ASYNC_SFT_STEPS), "--eval-every", "10", "--demo-mistakes", "0.7"]
    out, done = _demo(tmp_path, *flags)
    rl = _check_run(out, done, "async", ASYNC_STEPS, ASYNC_SFT_STEPS, 10)
    # The schedule: rollouts 0..DEPTH-1 are launched at once with the SFT weights; rollout k
    # (k >= DEPTH) is launched as step k - DEPTH starts training, so it is DEPTH versions old
    # when it is trained on. Its tokens can be newer than its launch (one CI run: rollout 8's
    # first token came after step 6's hotswap, staleness 1), never older.
    assert [r["launch_staleness"] for r in rl] == [min(k, DEPTH) for k in range(ASYNC_STEPS)]
    for r in rl:
        oldest, newest = r["sampled_versions"]
        assert r["weight_version"] - 1 - r["launch_staleness"] <= oldest
        assert oldest <= newest <= r["weight_version"] - 1
        assert 0 <= r["staleness"] <= r["launch_staleness"]
        assert {"wait_rollout", "generate_overlapped"} <= set(r["seconds"])
    # rollout k >= DEPTH was generated while step k - DEPTH trained
    assert all(r["generation_overlap_seconds"] > 0 for r in rl[DEPTH:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_staleness"] == DEPTH
    assert summary["staleness_max"] == max(r["staleness"] for r in rl) <= DEPTH
    assert summary["dropped_stale_rollouts"] == 0
    assert summary["rollouts_overlapping_training"] >= ASYNC_STEPS - DEPTH
    # A hotswap lands inside a rollout only when the rollout outlasts the update, which is a
    # matter of timing: on a loaded machine 3-6 of 20 rollouts spanned one, on a quiet one
    # none did (the 0.26 s rollout ends before the 0.27 s update). That a swap mid-generation
    # keeps its request on the old version up to the cut and the new one after is checked
    # deterministically at the engine (tests/integration/engines/test_vllm_loop.py, hotswap
    # tests, which hold the engine's loop to place the swap). Here: the count agrees with the
    # per-step records, and no rollout spans more than the versions it could have seen.
    across = [r for r in rl if r["sampled_versions"][0] < r["sampled_versions"][1]]
    assert summary["rollouts_across_a_hotswap"] == len(across)
    assert all(new - old <= DEPTH for old, new in (r["sampled_versions"] for r in across))
    # GRPO's own part: the warm start's habit keeps its greedy answers off the exact match,
    # GRPO removes the habit (the digits were learned before it). The full sync runs end at
    # 0.99-1.00 (README); this short async one ended at 0.75 in one CI run on a slower
    # machine, so its end bound is 0.6; the gain bound is the 0.3 (a GRPO that does
    # nothing ends at 0.0).
    warm, final = summary["heldout_exact_after_sft"], summary["heldout_exact_final"]
    assert warm <= 0.5 and final >= 0.6 and final - warm >= 0.3, summary
    assert summary["heldout_gain_from_rl"] == final - warm
    rewards = [r["reward_mean"] for r in rl]
    half = ASYNC_STEPS // 2
    assert sum(rewards[half:]) / half > sum(rewards[:half]) / half, rewards
