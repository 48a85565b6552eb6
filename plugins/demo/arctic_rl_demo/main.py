"""``arctic-rl demo``: SFT warm start then GRPO on the digit-reversal task, on this machine's CPU.

Through the public ``AsyncArcticRLClient`` only (the loop is ``runner``): a supervised warm
start (``fwd_bwd`` with ``cross_entropy`` on demonstrations, checkpoint saved), then GRPO on the
exact-match reward (generate → rewards → group advantages → ``fwd_bwd(loss_fn="grpo")`` with the
sampler's behaviour log-probs → ``step`` → ``sync_weights``). A fixed held-out set is scored by
greedy exact match before and after the warm start and every ``eval_every`` RL steps. With
``async_mode`` rollouts for later steps are generated while a step trains (``async_loop``).
"""

from __future__ import annotations

from typing import Any

from arctic_rl_demo import report
from arctic_rl_demo.run import DemoRun, DemoSettings
from arctic_rl_demo.runner import DemoTask, run_task

REVERSE = DemoTask(
    name="reverse",
    make_run=DemoRun,
    report=report,
    warm_steps=lambda s: s.sft_steps,
    rl_label=lambda s: f"GRPO ({'async' if s.async_mode else 'sync'})",
)


def run_demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the demo end to end; returns the summary (also written as ``summary.json``)."""
    return run_task(REVERSE, settings)
