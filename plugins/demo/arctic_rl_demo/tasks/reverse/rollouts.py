"""The reverse task's data, built on the client side: demonstrations, rollouts, GRPO batches,
scores.

Everything here is pure Python over what the public client returns, so the sync and the
``--async`` loops share it and unit tests cover it without engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from arctic_platform.rl.api import group_advantages, rollout_batch
from arctic_rl_demo.tasks.reverse.task import ReverseDigitsTask


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the demo uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def sft_batch(
    task: ReverseDigitsTask,
    pairs: list[tuple[str, str]],
    tokenizer: Tokenizer,
    habits: list[bool] | None = None,
) -> dict[str, Any]:
    """A ``cross_entropy`` batch: prompt + demonstration (with the demonstrator's habit where
    ``habits`` says so, one flag per pair) + end-of-text, loss on the answer."""
    eos = tokenizer.eos_token_id
    rows, masks = [], []
    flags = [False] * len(pairs) if habits is None else habits
    for (prompt, answer), habit in zip(pairs, flags, strict=True):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        shown = task.demonstration(answer, habit=habit)
        answer_ids = tokenizer.encode(shown, add_special_tokens=False)
        if eos is not None:
            answer_ids = [*answer_ids, eos]
        rows.append(prompt_ids + answer_ids)
        masks.append([0] * len(prompt_ids) + [1] * len(answer_ids))
    return {"input_ids": rows, "loss_mask": masks}


@dataclass
class Rollout:
    """One step's samples: prompts, the sampler's outputs, and when they were made.

    ``window``: the ``time.monotonic()`` seconds the generate call started and ended;
    ``launched_version``: the weight version served when the call was made (its tokens may be
    newer: a hotswap can land before the first one is sampled).
    """

    index: int
    pairs: list[tuple[str, str]]
    outputs: list[dict[str, Any]]
    seconds: float
    rewards: list[float] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)
    launched_version: int = 0

    @property
    def completions(self) -> list[dict[str, Any]]:
        """Every completion, prompt-major (``samples_per_prompt`` per prompt)."""
        return [c for out in self.outputs for c in out["completions"]]

    @property
    def versions(self) -> tuple[int, int]:
        """Oldest and newest weight version any of its tokens was sampled with."""
        starts = [int(c.get("weight_version_start", 0)) for c in self.completions]
        ends = [int(c.get("weight_version_end", 0)) for c in self.completions]
        return min(starts), max(ends)

    def score(self, task: ReverseDigitsTask) -> list[float]:
        """Training rewards (the task's ``train_reward``), one per completion (also kept in
        ``rewards``)."""
        self.rewards = [
            task.train_reward(c["text"], answer)
            for (_, answer), out in zip(self.pairs, self.outputs, strict=True)
            for c in out["completions"]
        ]
        return self.rewards


def grpo_batch(rollout: Rollout, samples_per_prompt: int) -> dict[str, Any]:
    """The ``grpo`` batch of a scored rollout: group advantages and the sampler's log-probs.

    ``rollout_log_probs`` are the log-probs the sampler reported for the tokens it sampled
    (the current policy in the sync loop, up to ``max_staleness`` versions older with
    ``--async``): the loss measures the mismatch against them and, with the demo's default
    ``bypass`` correction, takes them as the old policy of its importance ratio.
    """
    advantages = group_advantages(rollout.rewards, samples_per_prompt)
    return rollout_batch(rollout.outputs, advantages)


def exact_fraction(
    task: ReverseDigitsTask, outputs: list[dict[str, Any]], pairs: list[tuple[str, str]]
) -> float:
    """Share of prompts whose first completion is exactly the answer."""
    if not pairs:
        return 0.0
    hits = sum(
        task.reward(out["completions"][0]["text"], answer)
        for out, (_, answer) in zip(outputs, pairs, strict=True)
    )
    return hits / len(pairs)
