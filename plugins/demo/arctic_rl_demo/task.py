"""The demo's verifiable task: write a digit string backwards; the reward is exact match.

``reverse 3814:`` asks for `` 4183``. The tokenizer splits digits one per token, so the model
must learn to copy each digit from the mirrored position. A fixed held-out set of prompts
(drawn from its own seed) is never used for demonstrations or rollouts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from arctic_platform.rl.api import group_advantages

__all__ = [
    "CORRECTION_CHOICES",
    "REWARD_CHOICES",
    "ReverseDigitsTask",
    "group_advantages",
    "mismatch_record",
]


@dataclass(frozen=True)
class ReverseDigitsTask:
    """Prompts ``reverse <digits>:`` with ``digits`` characters; answers are the digits reversed."""

    digits: int = 4
    heldout_size: int = 128
    heldout_seed: int = 12345
    train_reward_kind: str = "exact"  # the GRPO reward: exact match, or digits in place

    def __post_init__(self) -> None:
        if self.train_reward_kind not in REWARD_CHOICES:
            raise ValueError(
                f"reward {self.train_reward_kind!r} is not one of {list(REWARD_CHOICES)}"
            )
        if self.digits < 2:
            raise ValueError(f"digits must be at least 2, got {self.digits}")
        if not 0 < self.heldout_size <= 10**self.digits // 4:
            raise ValueError(
                f"heldout_size={self.heldout_size} must be in [1, {10**self.digits // 4}] "
                f"for {self.digits}-digit prompts (at most a quarter of them)"
            )

    @staticmethod
    def prompt(digits: str) -> str:
        """The prompt text for a digit string."""
        return f"reverse {digits}:"

    @staticmethod
    def answer(digits: str) -> str:
        """The one exact answer (without the leading space the model writes)."""
        return digits[::-1]

    def _draw(self, rng: random.Random) -> str:
        return "".join(rng.choice("0123456789") for _ in range(self.digits))

    @cached_property
    def heldout(self) -> list[tuple[str, str]]:
        """The fixed held-out ``(prompt, answer)`` pairs, distinct, in a stable order."""
        rng = random.Random(self.heldout_seed)
        seen: dict[str, str] = {}
        while len(seen) < self.heldout_size:
            digits = self._draw(rng)
            seen.setdefault(digits, self.answer(digits))
        return [(self.prompt(d), a) for d, a in seen.items()]

    @cached_property
    def _heldout_digits(self) -> frozenset[str]:
        return frozenset(p.removeprefix("reverse ").removesuffix(":") for p, _ in self.heldout)

    def prompts(self, count: int, rng: random.Random) -> list[tuple[str, str]]:
        """``count`` training ``(prompt, answer)`` pairs; never a held-out prompt."""
        out: list[tuple[str, str]] = []
        while len(out) < count:
            digits = self._draw(rng)
            if digits not in self._heldout_digits:
                out.append((self.prompt(digits), self.answer(digits)))
        return out

    @staticmethod
    def demonstration(answer: str) -> str:
        """The completion a demonstration trains on (the model's end-of-text token follows)."""
        return " " + answer

    @staticmethod
    def reward(completion: str, answer: str) -> float:
        """1.0 when the completion, stripped of surrounding spaces, is exactly the answer."""
        return 1.0 if completion.strip() == answer else 0.0

    @staticmethod
    def digit_reward(completion: str, answer: str) -> float:
        """The share of the answer's digits in their place (the longer of completion and
        answer counts, so extra characters cost): 1.0 exactly when ``reward`` is 1.0."""
        text = completion.strip()
        hits = sum(a == b for a, b in zip(text, answer, strict=False))
        return hits / max(len(text), len(answer))

    def train_reward(self, completion: str, answer: str) -> float:
        """The reward GRPO trains on (``train_reward_kind``); evaluation stays exact match."""
        if self.train_reward_kind == "digits":
            return self.digit_reward(completion, answer)
        return self.reward(completion, answer)


REWARD_CHOICES = ("exact", "digits")


CORRECTION_CHOICES = (
    "none",
    "bypass",
    "token_tis",
    "seq_tis",
    "icepop",
    "seq_mask",
    "geo_rs",
    "seq_tis_rs",
    "token_tis_veto",
    "bypass_k3_rs",
)
"""What ``--correction`` takes: ``none`` (the trainer's own log-probs are the old policy) or a
rollout-correction preset of the losses."""


def mismatch_record(metrics: dict[str, Any]) -> dict[str, float | None]:
    """A GRPO step's sampler/trainer mismatch for the metrics file (None: not measured)."""
    names = {
        "mismatch_k1": "mismatch_k1",
        "mismatch_k3": "mismatch_k3",
        "mismatch_ratio_min": "mismatch_ratio.min",
        "mismatch_ratio_max": "mismatch_ratio.max",
        "rollout_is_ess": "rollout_is_ess",
    }
    return {
        key: (float(metrics[name]) if metrics.get(name) is not None else None)
        for key, name in names.items()
    }
