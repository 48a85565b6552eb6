"""The lookup demo's report: ``summary.json``, its table (``summary.md``) and ``reward.png``
(matplotlib imported when drawn)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from arctic_rl_demo.lookup_run import LookupRun, LookupSettings
from arctic_rl_demo.mismatch import draw_mismatch, mismatch_summary
from arctic_rl_demo.report_parts import phase_seconds, reward_figure, timing_rows


def summarize(
    run: LookupRun, before: float, after_sft: float, final: float, seconds: dict[str, float]
) -> dict[str, Any]:
    """The run's summary: held-out success, train rewards, errors and timings, settings."""
    s = run.settings
    rl = [r for r in run.records if r["phase"] == "rl"]
    evals = [r for r in run.records if r["phase"] == "eval"]
    rewards = [r["reward_mean"] for r in rl]
    k = min(5, len(rewards))
    n = max(1, len(rl))
    phases = phase_seconds(rl)
    settings = {key: str(v) if isinstance(v, Path) else v for key, v in asdict(s).items()}
    return {
        "task": "lookup",
        "sft_short_steps": s.sft_short_steps,
        "sft_steps": s.sft_steps,
        "steps": len(rl),
        "episodes_per_step": s.prompts_per_step * s.samples_per_prompt,
        "heldout_size": len(run.task.heldout),
        "heldout_success_before_sft": before,
        "heldout_success_after_sft": after_sft,
        "heldout_success_final": final,
        "heldout_gain_from_rl": final - after_sft,
        "heldout_curve": [[r["rl_step"], r["heldout_success"]] for r in evals if r["rl_step"] >= 0],
        "heldout_key_right_curve": [
            [r["rl_step"], r["heldout_key_right"]] for r in evals if r["rl_step"] >= 0
        ],
        "first5_reward": sum(rewards[:k]) / k if k else 0.0,
        "last5_reward": sum(rewards[-k:]) / k if k else 0.0,
        "rollout_errors": sum(r["errors"] for r in rl),
        **mismatch_summary(rl),
        "sft_checkpoint": run.sft_checkpoint,
        "setup_seconds": seconds["setup"],
        "sft_seconds": seconds.get("sft", 0.0),
        "rl_seconds": seconds.get("rl", 0.0),
        "eval_seconds": sum(r["seconds"] for r in evals),
        "total_seconds": seconds["total"],
        "mean_step_seconds_by_phase": {name: sec / n for name, sec in phases.items()},
        "settings": settings,
    }


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table (``summary.md``, printed at the end of a run)."""
    lines = [
        "| metric | value |",
        "|---|---|",
        "| task | lookup: call `lookup(key)`, answer with its value (openai-agents Runner) |",
        "| SFT steps (short demonstrations, full-length), then GRPO steps | "
        f"{summary['sft_short_steps']}, {summary['sft_steps']}, {summary['steps']} |",
        f"| episodes (agent sessions) per GRPO step | {summary['episodes_per_step']} |",
        f"| held-out success before SFT | {summary['heldout_success_before_sft']:.3f} |",
        f"| held-out success after SFT | {summary['heldout_success_after_sft']:.3f} |",
        f"| held-out success, final | {summary['heldout_success_final']:.3f} |",
        f"| held-out keys (greedy, never trained on) | {summary['heldout_size']} |",
        f"| train reward, first 5 GRPO steps | {summary['first5_reward']:.3f} |",
        f"| train reward, last 5 GRPO steps | {summary['last5_reward']:.3f} |",
        f"| rollouts that raised (reward 0) | {summary['rollout_errors']} |",
        *timing_rows(summary, "RL phase (with its evaluations)", "GRPO step time"),
    ]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], settings: LookupSettings, path: Path) -> None:
    """Train reward and held-out success over the GRPO steps (0: after the warm start; the
    success before it is in the legend), and the mismatch of each GRPO step under them,
    saved at ``path``."""
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    before = [r["heldout_success"] for r in evals if r["rl_step"] < 0]
    after = [r for r in evals if r["rl_step"] >= 0]
    xs = [r["rl_step"] for r in after]
    with reward_figure(path, "success") as (ax, low):
        ax.plot(
            [r["step"] + 1 for r in rl],
            [r["reward_mean"] for r in rl],
            label="train reward (exact answer, T=1)",
            alpha=0.7,
        )
        start = f"; before the warm start {before[0]:.2f}" if before else ""
        ax.plot(
            xs,
            [r["heldout_success"] for r in after],
            "o-",
            label=f"held-out success (greedy, {settings.heldout_size} keys{start})",
        )
        ax.plot(
            xs, [r["heldout_key_right"] for r in after], "x--", label="held-out: right key called"
        )
        warm = settings.sft_short_steps + settings.sft_steps
        draw_mismatch(low, [r["step"] + 1 for r in rl], rl)
        low.set_xlabel(f"GRPO step (0: after {warm} warm-start steps)")
        ax.set_title(
            f"Arctic RL demo: lookup agent (openai-agents), {settings.model_size} model, CPU",
            pad=10,
        )
