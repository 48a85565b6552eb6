"""``arctic-rl demo --task lookup``: an agent that learns to use a tool, on this machine's CPU;
``TASK`` is what the loop runs.

The tiny ChatML (tool-calling) model, through the public ``AsyncArcticRLClient`` only (the
loop is ``arctic_rl_demo.runner``): held-out success through the agent path, a supervised warm
start on rendered demonstrations (``sft``), then GRPO whose rollouts are openai-agents runs in
agent sessions (``agent``) and whose batches are the sessions' trajectories (``grpo``).
"""

from __future__ import annotations

from arctic_rl_demo.runner import DemoTask
from arctic_rl_demo.tasks.lookup import report
from arctic_rl_demo.tasks.lookup.run import LookupRun
from arctic_rl_demo.tasks.lookup.settings import LookupSettings

TASK = DemoTask(
    name="lookup",
    settings=LookupSettings,
    make_run=LookupRun,
    report=report,
    rl_label=lambda s: "GRPO (agent)",
    chat_format="chatml",
    env={"OPENAI_AGENTS_DISABLE_TRACING": "1"},
)
