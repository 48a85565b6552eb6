"""The lookup task's report: ``summary.json``, its table (``summary.md``), ``reward.png``
(matplotlib imported when drawn) and the command's one-line result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arctic_rl_demo import report_parts
from arctic_rl_demo.mismatch import draw_mismatch
from arctic_rl_demo.tasks.lookup.run import LookupRun
from arctic_rl_demo.tasks.lookup.settings import LookupSettings


def summarize(
    run: LookupRun, before: float, after_sft: float, final: float, seconds: dict[str, float]
) -> dict[str, Any]:
    """The run's summary: held-out success, train rewards, errors and timings, settings."""
    s = run.settings
    rl, evals = report_parts.split_phases(run.records)
    return {
        "task": "lookup",
        "sft_short_steps": s.sft_short_steps,
        "sft_steps": s.sft_steps,
        "steps": len(rl),
        "episodes_per_step": s.prompts_per_step * s.samples_per_prompt,
        "heldout_size": len(run.task.heldout),
        **report_parts.heldout_scores("success", before, after_sft, final),
        "heldout_curve": report_parts.heldout_curve(evals, "heldout_success"),
        "heldout_key_right_curve": report_parts.heldout_curve(evals, "heldout_key_right"),
        **report_parts.reward_ends(rl, 5),
        "rollout_errors": sum(r["errors"] for r in rl),
        **report_parts.run_figures(run, seconds, rl, evals),
    }


def headline(summary: dict[str, Any], settings: LookupSettings) -> str:
    """The command's one-line result: held-out success before and after each phase, the time,
    the plot's path."""
    return (
        f"held-out success ({summary['heldout_size']} keys, greedy, openai-agents): before SFT "
        f"{summary['heldout_success_before_sft']:.3f}, after SFT "
        f"{summary['heldout_success_after_sft']:.3f}, final {summary['heldout_success_final']:.3f} "
        f"(RL adds {summary['heldout_gain_from_rl']:+.3f}); {summary['total_seconds'] / 60:.1f} "
        f"min; plot: {settings.output_dir / 'reward.png'}"
    )


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
        *report_parts.timing_rows(summary, "RL phase (with its evaluations)", "GRPO step time"),
    ]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], settings: LookupSettings, path: Path) -> None:
    """Train reward and held-out success over the GRPO steps (0: after the warm start; the
    success before it is in the legend), and the mismatch of each GRPO step under them,
    saved at ``path``."""
    rl, evals = report_parts.split_phases(records)
    before = [r["heldout_success"] for r in evals if r["rl_step"] < 0]
    after = [r for r in evals if r["rl_step"] >= 0]
    xs = [r["rl_step"] for r in after]
    with report_parts.reward_figure(path, "success") as (ax, low):
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
        draw_mismatch(low, [r["step"] + 1 for r in rl], rl)
        low.set_xlabel(f"GRPO step (0: after {settings.warm_steps} warm-start steps)")
        ax.set_title(
            f"Arctic RL demo: lookup agent (openai-agents), {settings.model_size} model, CPU",
            pad=10,
        )
