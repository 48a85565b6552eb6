"""The demo's verifiable task: write a digit string backwards; the reward is exact match.

``reverse 3814:`` asks for `` 4183``. The tokenizer splits digits one per token, so the model
must learn to copy each digit from the mirrored position. A fixed held-out set of prompts
(drawn from its own seed) is never used for demonstrations or rollouts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from arctic_platform.rl.api import group_advantages
from arctic_rl_demo.heldout import HeldOutDigits

__all__ = ["REWARD_CHOICES", "ReverseDigitsTask", "group_advantages"]


@dataclass(frozen=True)
class ReverseDigitsTask(HeldOutDigits):
    """Prompts ``reverse <digits>:`` with ``digits`` characters; answers are the digits reversed."""

    train_reward_kind: str = "exact"  # the GRPO reward: exact match, or digits in place

    keys_are: ClassVar[str] = "prompts"

    def __post_init__(self) -> None:
        if self.train_reward_kind not in REWARD_CHOICES:
            raise ValueError(
                f"reward {self.train_reward_kind!r} is not one of {list(REWARD_CHOICES)}"
            )
        super().__post_init__()

    @staticmethod
    def prompt(digits: str) -> str:
        """The prompt text for a digit string."""
        return f"reverse {digits}:"

    @staticmethod
    def answer(digits: str) -> str:
        """The one exact answer (without the leading space the model writes)."""
        return digits[::-1]

    def heldout_pair(self, rng: random.Random) -> tuple[str, str]:
        """A held-out digit string and its answer."""
        digits = self.draw(rng)
        return digits, self.answer(digits)

    @cached_property
    def heldout(self) -> list[tuple[str, str]]:
        """The fixed held-out ``(prompt, answer)`` pairs, distinct, in a stable order."""
        return [(self.prompt(d), a) for d, a in self.heldout_answers.items()]

    def prompts(self, count: int, rng: random.Random) -> list[tuple[str, str]]:
        """``count`` training ``(prompt, answer)`` pairs; never a held-out prompt."""
        return self.training(count, rng, lambda d: (self.prompt(d), self.answer(d)))

    @staticmethod
    def demonstration(answer: str, habit: bool = False) -> str:
        """The completion a demonstration trains on (the model's end-of-text token follows);
        with ``habit``, the demonstrator's full stop after the digits, which ``reward``
        refuses."""
        return " " + answer + ("." if habit else "")

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
