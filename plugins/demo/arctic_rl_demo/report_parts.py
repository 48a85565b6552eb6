"""What the demo tasks' reports share: the summary's held-out, reward and timing figures, the
timing and mismatch rows of ``summary.md`` and the reward figure's frame (reward curves on top,
the mismatch panel under them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from arctic_rl_demo.mismatch import mismatch_rows, mismatch_summary


def split_phases(
    records: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run's GRPO step records and its held-out evaluation records, in order."""
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    return rl, evals


def heldout_scores(metric: str, before: float, after_sft: float, final: float) -> dict[str, float]:
    """The held-out ``metric`` before and after the warm start and at the end, and what GRPO
    added to it."""
    return {
        f"heldout_{metric}_before_sft": before,
        f"heldout_{metric}_after_sft": after_sft,
        f"heldout_{metric}_final": final,
        "heldout_gain_from_rl": final - after_sft,
    }


def heldout_curve(evals: list[dict[str, Any]], name: str) -> list[list[float]]:
    """``[rl_step, value of name]`` of each evaluation from the warm start's end on."""
    return [[r["rl_step"], r[name]] for r in evals if r["rl_step"] >= 0]


def reward_ends(rl: list[dict[str, Any]], k: int) -> dict[str, float]:
    """The mean train reward of the first and of the last ``k`` GRPO steps."""
    rewards = [r["reward_mean"] for r in rl]
    n = min(k, len(rewards))
    first, last = (sum(rewards[:n]) / n, sum(rewards[-n:]) / n) if n else (0.0, 0.0)
    return {f"first{k}_reward": first, f"last{k}_reward": last}


def phase_seconds(rl: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of each phase of a GRPO step (generate, fwd_bwd, ...), summed over the steps."""
    phases: dict[str, float] = {}
    for r in rl:
        for name, sec in r["seconds"].items():
            phases[name] = phases.get(name, 0.0) + sec
    return phases


def run_figures(
    run: Any,
    seconds: dict[str, float],
    rl: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    step_rate: bool = False,
) -> dict[str, Any]:
    """The summary's closing figures: the mismatch, the warm start's checkpoint, the phases'
    seconds (``step_rate``: also GRPO steps per second, evaluations excluded), each step phase's
    mean and the settings."""
    phases = phase_seconds(rl)
    rates: dict[str, float] = {}
    if step_rate:
        step_seconds = phases.get("total", 0.0)
        rates["rl_step_seconds"] = step_seconds
        rates["rl_steps_per_second"] = len(rl) / step_seconds if step_seconds > 0 else 0.0
    n = max(1, len(rl))
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(run.settings).items()}
    return {
        **mismatch_summary(rl),
        "sft_checkpoint": run.sft_checkpoint,
        "setup_seconds": seconds["setup"],
        "sft_seconds": seconds.get("sft", 0.0),
        "rl_seconds": seconds.get("rl", 0.0),
        **rates,
        "eval_seconds": sum(r["seconds"] for r in evals),
        "total_seconds": seconds["total"],
        "mean_step_seconds_by_phase": {name: sec / n for name, sec in phases.items()},
        "settings": settings,
    }


def timing_rows(summary: dict[str, Any], rl_phase: str, step_label: str) -> list[str]:
    """Set-up, SFT, RL and total seconds, the mismatch rows, and each step phase's mean."""
    lines = [
        f"| set-up (server, Ray, engines) | {summary['setup_seconds']:.1f} s |",
        f"| SFT phase (with 2 evaluations) | {summary['sft_seconds']:.1f} s |",
        f"| {rl_phase} | {summary['rl_seconds']:.1f} s |",
    ]
    if "rl_steps_per_second" in summary:
        lines.append(
            f"| RL steps per second (evaluations excluded) | {summary['rl_steps_per_second']:.3f} |"
        )
    lines.append(f"| total | {summary['total_seconds']:.1f} s |")
    lines.extend(mismatch_rows(summary))
    for name, sec in summary["mean_step_seconds_by_phase"].items():
        lines.append(f"| {step_label}: {name} | {sec:.3f} s |")
    return lines


@contextmanager
def reward_figure(path: Path, ylabel: str) -> Iterator[tuple[Any, Any]]:
    """The two panels (``ax`` for the rewards, ``low`` for the mismatch) of a reward figure;
    on leaving, the top panel gets its label, range, grid and legend and the figure is saved
    at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, low) = plt.subplots(
        2, 1, figsize=(8, 6.4), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    try:
        yield ax, low
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
