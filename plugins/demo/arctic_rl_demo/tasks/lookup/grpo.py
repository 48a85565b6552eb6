"""The ``grpo`` batch of a step's lookup episodes, straight from the sessions' trajectories.

Episodes come prompt-major (``group_size`` per prompt, each in its own session). Each one's
reward is normalised within its group; the advantage goes with every row of its session's
trajectory ``batch`` (``input_ids``, ``loss_mask`` 1 on sampled ids only, ``rollout_log_probs``
the sampler's), so the loss's importance ratio is against the policy that sampled them.
"""

from __future__ import annotations

from typing import Any

from arctic_platform.rl.api import group_advantages
from arctic_rl_demo.tasks.lookup.agent import EpisodeResult

FIELDS = ("input_ids", "loss_mask", "rollout_log_probs")


def grpo_batch(results: list[EpisodeResult], group_size: int) -> dict[str, Any]:
    """The batch of every episode whose group's rewards differ (the others have no signal)."""
    advantages = group_advantages([r.reward for r in results], group_size)
    batch: dict[str, Any] = {name: [] for name in (*FIELDS, "advantages")}
    for result, advantage in zip(results, advantages, strict=True):
        rows = result.batch.get("input_ids") or []
        if advantage == 0 or not rows:
            continue
        for name in FIELDS:
            values = result.batch[name]
            if len(values) != len(rows):
                raise ValueError(
                    f"a trajectory batch has {len(rows)} rows but {name} has {len(values)}"
                )
            batch[name].extend(values)
        batch["advantages"].extend([advantage] * len(rows))
    return batch
