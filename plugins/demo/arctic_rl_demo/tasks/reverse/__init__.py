"""``arctic-rl demo`` (``--task reverse``, the default): SFT warm start then GRPO on the
digit-reversal task, on this machine's CPU; ``TASK`` is what the loop runs.

Through the public ``AsyncArcticRLClient`` only (the loop is ``arctic_rl_demo.runner``): a
supervised warm start (``fwd_bwd`` with ``cross_entropy`` on demonstrations, checkpoint saved),
then GRPO on the exact-match reward (generate → rewards → group advantages →
``fwd_bwd(loss_fn="grpo")`` with the sampler's behaviour log-probs → ``step`` →
``sync_weights``). A fixed held-out set is scored by greedy exact match before and after the
warm start and every ``eval_every`` RL steps. With ``async_mode`` rollouts for later steps are
generated while a step trains (``async_loop``).
"""

from __future__ import annotations

from arctic_rl_demo.runner import DemoTask
from arctic_rl_demo.tasks.reverse import report
from arctic_rl_demo.tasks.reverse.run import DemoRun
from arctic_rl_demo.tasks.reverse.settings import DemoSettings

TASK = DemoTask(
    name="reverse",
    settings=DemoSettings,
    make_run=DemoRun,
    report=report,
    rl_label=lambda s: f"GRPO ({'async' if s.async_mode else 'sync'})",
)
