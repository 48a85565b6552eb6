"""``arctic-rl demo --async``: one-step (``max_staleness``-step) off-policy GRPO.

Rollouts for step ``k + max_staleness`` are generated while step ``k`` trains; after each
update the sampler gets the new weights with ``sync_weights(strategy="hotswap")``, between
two decode steps of whatever is in flight. Every completion reports the weight versions its
tokens were sampled with; a rollout older than ``max_staleness`` versions at training time
is sampled again (it cannot happen with this schedule, but the bound is checked, not assumed).
The loss's importance ratio uses the sampler's own (behaviour) log-probs (``grpo_batch``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from arctic_rl_demo.tasks.reverse.rollouts import Rollout
    from arctic_rl_demo.tasks.reverse.run import DemoRun


async def rl_async(run: DemoRun, bar: Any) -> None:
    """Run ``run.settings.steps`` GRPO steps with generation overlapping training."""
    settings = run.settings
    depth = settings.max_staleness
    pending: deque[asyncio.Task[Rollout]] = deque()

    def launch(index: int) -> None:
        pending.append(asyncio.create_task(run.rollout(index, run.draw())))

    for index in range(min(depth, settings.steps)):
        launch(index)
    try:
        for step in range(settings.steps):
            t0 = time.monotonic()
            rollout = await pending.popleft()
            timings = {"wait_rollout": time.monotonic() - t0}
            if run.weight_version - rollout.versions[0] > settings.max_staleness:
                run.dropped_stale += 1
                rollout = await run.rollout(step, rollout.pairs)
                timings["resample"] = rollout.seconds
            if step + depth < settings.steps:
                launch(step + depth)
            timings["generate_overlapped"] = rollout.seconds
            record = await run.train(rollout, step, "hotswap", timings)
            timings["total"] = time.monotonic() - t0
            await run.after_step(record, timings, bar)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
