"""The reverse task's settings (``DemoSettings``): the loop's own, and the warm start, batch
sizes, reward, ``--async`` pipeline and LoRA rank of digit reversal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from arctic_rl_demo.settings import LoopSettings
from arctic_rl_demo.tasks.reverse.task import REWARD_CHOICES, ReverseDigitsTask

LORA_SFT_STEPS = 95
"""Warm-start steps with ``--lora`` unless ``--sft-steps`` says otherwise: an adapter learns the
task's format more slowly than all the weights at the same learning rate (rank 32, seed 0:
held-out 0.102 after 80 steps, 0.383 after 95, 1.000 after 120; a 3x GRPO learning rate
collapsed it to 0.000, so the rates stay those of full fine-tuning). Its warm start has no
demonstrator's habit unless ``--demo-mistakes`` says so: with it (and 300 warm-start steps)
seed 0's adapter reached 1.000 after 5 GRPO steps but fell to 0.414 by step 20 at this GRPO
rate, so the LoRA run stays the one where GRPO learns the last of the reversal itself."""


@dataclass
class DemoSettings(LoopSettings):
    """What one demo run does (``steps`` counts RL steps; the warm start has its own).

    The warm start learns reversal itself: without the habit, 200 steps reach held-out 1.000
    (seed 1; 80 steps: 0.078). With 70 % of its demonstrations ending in a full stop
    (``demo_mistakes``), greedy answers carry it (0.000) until GRPO removes it: 1.000 after 5
    steps for seeds 0, 1 and 2. Before, a 40-step warm start left GRPO to learn reversal from
    0.094 / 0.023 / 0.055 (seeds 0 / 1 / 2), which only seed 0 did in 80 steps (0.969; seeds
    1 and 2 ended at 0.109 and 0.055); 80 steps with the habit left seed 1 at 0.094 after 20
    GRPO steps (the digits not yet learned).
    """

    steps: int = 20
    eval_every: int = 5
    learning_rate: float = 1e-3
    sft_steps: int = 200
    demo_mistakes: float = 0.7
    prompts_per_step: int = 16
    samples_per_prompt: int = 16
    max_tokens: int = 8
    kl_coef: float = 0.0
    reward: str = "exact"  # GRPO's reward: exact match, or "digits" (the share in place)
    digits: int = ReverseDigitsTask.digits
    heldout_size: int = ReverseDigitsTask.heldout_size
    async_mode: bool = False
    max_staleness: int = 1
    lora_rank: int | None = None  # train a LoRA adapter of this rank instead of every weight

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1 or self.sft_steps < 0:
            raise ValueError(f"steps={self.steps} must be >= 1 and sft_steps >= 0")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ValueError(f"lora_rank={self.lora_rank} must be >= 1")
        if self.async_mode and self.max_staleness < 1:
            raise ValueError(
                f"max_staleness={self.max_staleness}: the async pipeline needs at least 1 "
                "(0 is the synchronous loop: leave out --async)"
            )
        if self.reward not in REWARD_CHOICES:
            raise ValueError(f"reward {self.reward!r} is not one of {list(REWARD_CHOICES)}")

    @classmethod
    def from_flags(cls, flags: dict[str, Any]) -> Self:
        """The settings from the command's flags; ``--lora`` without ``--sft-steps`` warm
        starts for ``LORA_SFT_STEPS``, without ``--demo-mistakes`` on bare answers only."""
        if flags.get("sft_short_steps") is not None:
            raise SystemExit("--sft-short-steps is the lookup task's (--task lookup)")
        if flags.get("lora_rank") is not None:
            lora_defaults = {"sft_steps": LORA_SFT_STEPS, "demo_mistakes": 0.0}
            flags = {**flags, **{k: v for k, v in lora_defaults.items() if flags.get(k) is None}}
        return super().from_flags(flags)
