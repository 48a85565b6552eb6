"""What both demo reports share: the timing and mismatch rows of ``summary.md`` and the reward
figure's frame (reward curves on top, the mismatch panel under them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arctic_rl_demo.mismatch import mismatch_rows


def phase_seconds(rl: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of each phase of a GRPO step (generate, fwd_bwd, ...), summed over the steps."""
    phases: dict[str, float] = {}
    for r in rl:
        for name, sec in r["seconds"].items():
            phases[name] = phases.get(name, 0.0) + sec
    return phases


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
