"""The reverse task's report: the run summary (``summary.json``), its table (``summary.md``), the
reward plot (``reward.png``, matplotlib imported when drawn) and the command's one-line result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arctic_rl_demo import report_parts
from arctic_rl_demo.mismatch import draw_mismatch
from arctic_rl_demo.tasks.reverse.run import DemoRun
from arctic_rl_demo.tasks.reverse.settings import DemoSettings


def summarize(
    run: DemoRun, before: float, after_sft: float, final: float, seconds: dict[str, float]
) -> dict[str, Any]:
    """The run's summary: held-out scores, rewards, staleness, overlap, timings, settings."""
    s = run.settings
    rl, evals = report_parts.split_phases(run.records)
    n = max(1, len(rl))
    staleness = [r["staleness"] for r in rl]
    return {
        "mode": "async" if s.async_mode else "sync",
        "weights": weights_trained(s),
        "mean_sync_bytes": sum(r.get("sync_bytes", 0) for r in rl) / n,
        "max_staleness": s.max_staleness if s.async_mode else 0,
        "sft_steps": s.sft_steps,
        "steps": len(rl),
        "heldout_size": len(run.task.heldout),
        **report_parts.heldout_scores("exact", before, after_sft, final),
        "heldout_curve": report_parts.heldout_curve(evals, "heldout_exact"),
        **report_parts.reward_ends(rl, 10),
        "staleness_max": max(staleness, default=0),
        "staleness_mean": sum(staleness) / n,
        "dropped_stale_rollouts": run.dropped_stale,
        "rollouts_across_a_hotswap": sum(
            1 for r in rl if r["sampled_versions"][0] != r["sampled_versions"][1]
        ),
        "generation_overlap_seconds": sum(r["generation_overlap_seconds"] for r in rl),
        "rollouts_overlapping_training": sum(1 for r in rl if r["generation_overlap_seconds"] > 0),
        "mean_importance_ratio": sum(r["ratio"] for r in rl) / n,
        **report_parts.run_figures(run, seconds, rl, evals, step_rate=True),
    }


def headline(summary: dict[str, Any], settings: DemoSettings) -> str:
    """The command's one-line result: held-out exact match, mode, speed, the plot's path."""
    return (
        f"held-out exact match ({summary['heldout_size']} prompts, greedy): after SFT "
        f"{summary['heldout_exact_after_sft']:.3f}, final {summary['heldout_exact_final']:.3f} "
        f"(RL adds {summary['heldout_gain_from_rl']:+.3f}); {summary['mode']}, "
        f"{summary['weights']}, "
        f"{summary['rl_steps_per_second']:.2f} RL steps/s, {summary['total_seconds'] / 60:.1f} "
        f"min; plot: {settings.output_dir / 'reward.png'}"
    )


def weights_trained(settings: DemoSettings) -> str:
    """What the run trains: every weight, or a LoRA adapter of some rank."""
    return f"LoRA rank {settings.lora_rank}" if settings.lora_rank else "all weights"


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table (``summary.md``, printed at the end of a run)."""
    mode = summary["mode"]
    reward = summary["settings"].get("reward", "exact")
    if mode == "async":
        mode += f" (max staleness {summary['max_staleness']})"
    lines = [
        "| metric | value |",
        "|---|---|",
        f"| mode | {mode} |",
        f"| weights trained | {summary['weights']} |",
        f"| bytes moved per weight sync (mean) | {summary['mean_sync_bytes']:,.0f} |",
        f"| SFT steps, then GRPO steps | {summary['sft_steps']}, {summary['steps']} |",
        f"| held-out exact match before SFT | {summary['heldout_exact_before_sft']:.3f} |",
        f"| held-out exact match after SFT | {summary['heldout_exact_after_sft']:.3f} |",
        f"| held-out exact match, final | {summary['heldout_exact_final']:.3f} |",
        f"| held-out prompts (greedy, never trained on) | {summary['heldout_size']} |",
        f"| train reward ({reward}), first 10 RL steps | {summary['first10_reward']:.3f} |",
        f"| train reward ({reward}), last 10 RL steps | {summary['last10_reward']:.3f} |",
        f"| staleness, max / mean (versions) | {summary['staleness_max']} / "
        f"{summary['staleness_mean']:.2f} |",
        f"| rollouts generated during an update (overlap) | "
        f"{summary['rollouts_overlapping_training']} "
        f"({summary['generation_overlap_seconds']:.1f} s) |",
        *report_parts.timing_rows(summary, "RL phase", "RL step time"),
    ]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], settings: DemoSettings, path: Path) -> None:
    """Train reward and held-out exact match over the optimizer steps, and the mismatch of
    each GRPO step under them, saved at ``path``."""
    sft = settings.sft_steps
    rl, evals = report_parts.split_phases(records)
    with report_parts.reward_figure(path, "exact match") as (ax, low):
        ax.plot(
            [sft + r["step"] + 1 for r in rl],
            [r["reward_mean"] for r in rl],
            label=f"train reward ({settings.reward} of samples, T=1)",
            alpha=0.7,
        )
        ax.plot(
            [0 if r["rl_step"] < 0 else sft + r["rl_step"] for r in evals],
            [r["heldout_exact"] for r in evals],
            "o-",
            label=f"held-out exact match (greedy, {settings.heldout_size} prompts)",
        )
        ax.axvline(sft, color="grey", linestyle="--")
        ax.text(sft, 1.02, " SFT | GRPO", color="grey", va="bottom", ha="center")
        mode = "async, one-step off-policy" if settings.async_mode else "sync"
        draw_mismatch(low, [sft + r["step"] + 1 for r in rl], rl)
        low.set_xlabel("optimizer step (SFT steps, then GRPO steps)")
        ax.set_title(
            f"Arctic RL demo: reverse {settings.digits} digits, {settings.model_size} model, "
            f"CPU ({mode}, {weights_trained(settings)})",
            pad=18,
        )
