"""The demo's verifiable task: write digits whose sum equals a target; rewards are exact."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class DigitSumTask:
    """Prompts ask for digits summing to a target in ``[low, high]``."""

    low: int = 3
    high: int = 18

    def prompts(self, count: int, rng: random.Random) -> list[tuple[str, int]]:
        """``count`` (prompt, target) pairs."""
        out = []
        for _ in range(count):
            target = rng.randint(self.low, self.high)
            out.append((f"digits summing to {target}:", target))
        return out

    @staticmethod
    def reward(completion: str, target: int) -> float:
        """Exact reward in [0, 1]: 0.3 for answering in digits only, 0.7 for how close the sum is.

        ``format`` is the share of non-space characters that are digits; ``closeness`` is
        ``1 - |sum - target| / target`` (at least 0), and 0 when there are no digits.
        """
        chars = [c for c in completion if not c.isspace()]
        digits = [int(c) for c in chars if c.isdigit()]
        if not chars or not digits:
            return 0.0
        fmt = len(digits) / len(chars)
        closeness = max(0.0, 1.0 - abs(sum(digits) - target) / target)
        return 0.3 * fmt + 0.7 * closeness


def group_advantages(rewards: list[float], group_size: int, eps: float = 1e-6) -> list[float]:
    """GRPO advantages: each reward minus its group's mean, over the group's std (+eps)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        var = sum((r - mean) ** 2 for r in group) / len(group)
        std = var**0.5
        out.extend((r - mean) / (std + eps) if std > 0 else 0.0 for r in group)
    return out
