"""``arctic-rl demo --task lookup``: an agent that learns to use a tool, on this machine's CPU.

The tiny ChatML (tool-calling) model, through the public ``AsyncArcticRLClient`` only (the loop
is ``runner``): held-out success through the agent path, a supervised warm start on rendered
demonstrations, then GRPO whose rollouts are openai-agents runs in agent sessions
(``lookup_agent``) and whose batches are the sessions' trajectories (``lookup_grpo``).
"""

from __future__ import annotations

from typing import Any

from arctic_rl_demo import lookup_report
from arctic_rl_demo.lookup_run import LookupRun, LookupSettings
from arctic_rl_demo.runner import DemoTask, run_task

LOOKUP = DemoTask(
    name="lookup",
    make_run=LookupRun,
    report=lookup_report,
    warm_steps=lambda s: s.sft_short_steps + s.sft_steps,
    rl_label=lambda s: "GRPO (agent)",
    chat_format="chatml",
    env={"OPENAI_AGENTS_DISABLE_TRACING": "1"},
)


def run_lookup_demo(settings: LookupSettings) -> dict[str, Any]:
    """Run the lookup demo end to end; returns the summary (also written as ``summary.json``)."""
    return run_task(LOOKUP, settings)
