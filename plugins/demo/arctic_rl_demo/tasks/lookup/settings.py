"""The lookup task's settings (``LookupSettings``): the loop's own, and the curriculum warm start
and agent rollouts of the tool-calling agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from arctic_rl_demo.settings import LoopSettings, run_dir
from arctic_rl_demo.tasks.lookup.task import LookupTask


@dataclass
class LookupSettings(LoopSettings):
    """What one lookup-demo run does (``steps`` counts GRPO steps; the warm start has its own).

    The warm start is a curriculum: ``sft_short_steps`` on demonstrations without the chat
    template's tool block (about 85 tokens), then ``sft_steps`` at full length (about 320).
    Measured (tiny model, CPU, seed 0, lr 2e-3, batch 32): at full length alone the masked
    loss plateaus at 0.66 (the 8 copied digits at chance, ln 10 each, over 28 trained tokens;
    held-out 0.000 after 180 steps, also for wider, deeper and lower-RoPE-base models); with
    short demonstrations the copy is learned after about 110 steps, and it carries over to the
    full prompt (the copy sits at the same relative offsets) after about 10 full-length steps.
    Four full-length steps were enough on one machine (held-out 0.03-0.86 after the warm start,
    0.89-1.00 after GRPO) but not on another (an AVX-512/AMX Xeon: 0.06 after the warm start,
    the full-length loss still 0.56-1.0, and GRPO had nothing to work from): the full-length
    loss needs about 20 steps to settle below 0.1 there. With 24, seeds 0/1/2 start GRPO at
    1.00/0.67/0.97 and end at 1.00/1.00/0.94. A GRPO rate of 1e-3 collapsed seed 0 from
    0.98 to 0.00 for a few steps (recovered by step 15); 5e-4 did not.
    """

    steps: int = 30
    eval_every: int = 5
    learning_rate: float = 5e-4
    output_dir: Path = field(default_factory=run_dir("demo-lookup"))
    sft_short_steps: int = 200
    sft_steps: int = 24
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_tokens: int = 32
    digits: int = LookupTask.digits
    heldout_size: int = LookupTask.heldout_size
    demo_mistakes: float = 0.7
    """The share of warm-start demonstrations whose answer adds a remark to the value ("8862
    is the value."): a demonstrator's habit that the warm start imitates and only the exact
    reward corrects, so what GRPO adds is seen on its own. Tried first (seeds 0-2): answering
    with the key instead (its copy is the easier one: at shares 0.3-0.7 the warm start ended
    anywhere from all-key, where GRPO never saw a reward, to 0.73 right), and the value inside
    a sentence ("The value is 8862.": the bare answer's copy, learned from the other 30 %
    only, stayed wrong on its first digit for seed 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1 or self.sft_steps < 0 or self.sft_short_steps < 0:
            raise ValueError(
                f"steps={self.steps} must be >= 1, sft_steps={self.sft_steps} and "
                f"sft_short_steps={self.sft_short_steps} >= 0"
            )
        if self.samples_per_prompt < 2:
            raise ValueError("GRPO needs samples_per_prompt >= 2 (group-normalised rewards)")
        if self.transport != "http":
            raise ValueError("the lookup demo needs the http transport (agent sessions' URLs)")

    @property
    def warm_steps(self) -> int:
        """The warm start's steps: the short demonstrations', then the full-length ones'."""
        return self.sft_short_steps + self.sft_steps

    @classmethod
    def from_flags(cls, flags: dict[str, Any]) -> Self:
        """The settings from the command's flags; the reverse task's ``--async``, ``--lora``,
        ``--kl-coef`` and ``--reward`` are refused."""
        if (
            flags.get("async_mode")
            or flags.get("lora_rank") is not None
            or flags.get("kl_coef")
            or flags.get("reward")
        ):
            raise SystemExit("--task lookup takes no --async, --lora, --kl-coef or --reward")
        return super().from_flags(flags)
