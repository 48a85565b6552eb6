"""The demo's report: the run summary (``summary.json``), its table (``summary.md``) and the
reward plot (``reward.png``, matplotlib imported when drawn)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from arctic_rl_demo.mismatch import draw_mismatch, mismatch_summary
from arctic_rl_demo.report_parts import phase_seconds, reward_figure, timing_rows
from arctic_rl_demo.run import DemoRun, DemoSettings


def summarize(
    run: DemoRun, before: float, after_sft: float, final: float, seconds: dict[str, float]
) -> dict[str, Any]:
    """The run's summary: held-out scores, rewards, staleness, overlap, timings, settings."""
    s = run.settings
    rl = [r for r in run.records if r["phase"] == "rl"]
    evals = [r for r in run.records if r["phase"] == "eval"]
    rewards = [r["reward_mean"] for r in rl]
    k = min(10, len(rewards))
    phases = phase_seconds(rl)
    rl_step_seconds = phases.get("total", 0.0)
    n = max(1, len(rl))
    staleness = [r["staleness"] for r in rl]
    settings = {key: str(v) if isinstance(v, Path) else v for key, v in asdict(s).items()}
    return {
        "mode": "async" if s.async_mode else "sync",
        "weights": weights_trained(s),
        "mean_sync_bytes": sum(r.get("sync_bytes", 0) for r in rl) / n,
        "max_staleness": s.max_staleness if s.async_mode else 0,
        "sft_steps": s.sft_steps,
        "steps": len(rl),
        "heldout_size": len(run.task.heldout),
        "heldout_exact_before_sft": before,
        "heldout_exact_after_sft": after_sft,
        "heldout_exact_final": final,
        "heldout_gain_from_rl": final - after_sft,
        "heldout_curve": [[r["rl_step"], r["heldout_exact"]] for r in evals if r["rl_step"] >= 0],
        "first10_reward": sum(rewards[:k]) / k if k else 0.0,
        "last10_reward": sum(rewards[-k:]) / k if k else 0.0,
        "staleness_max": max(staleness, default=0),
        "staleness_mean": sum(staleness) / n,
        "dropped_stale_rollouts": run.dropped_stale,
        "rollouts_across_a_hotswap": sum(
            1 for r in rl if r["sampled_versions"][0] != r["sampled_versions"][1]
        ),
        "generation_overlap_seconds": sum(r["generation_overlap_seconds"] for r in rl),
        "rollouts_overlapping_training": sum(1 for r in rl if r["generation_overlap_seconds"] > 0),
        "mean_importance_ratio": sum(r["ratio"] for r in rl) / n,
        **mismatch_summary(rl),
        "sft_checkpoint": run.sft_checkpoint,
        "setup_seconds": seconds["setup"],
        "sft_seconds": seconds.get("sft", 0.0),
        "rl_seconds": seconds.get("rl", 0.0),
        "rl_step_seconds": rl_step_seconds,
        "rl_steps_per_second": len(rl) / rl_step_seconds if rl_step_seconds > 0 else 0.0,
        "eval_seconds": sum(r["seconds"] for r in evals),
        "total_seconds": seconds["total"],
        "mean_step_seconds_by_phase": {name: sec / n for name, sec in phases.items()},
        "settings": settings,
    }


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
        *timing_rows(summary, "RL phase", "RL step time"),
    ]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], settings: DemoSettings, path: Path) -> None:
    """Train reward and held-out exact match over the optimizer steps, and the mismatch of
    each GRPO step under them, saved at ``path``."""
    sft = settings.sft_steps
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    with reward_figure(path, "exact match") as (ax, low):
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
