"""What every task's run shares (``TaskRun``): its state (client, tokenizer, RNG, log), the
supervised step and the save-and-sync that ends a warm start, the GRPO loss config, and what
follows each GRPO step (the held-out evaluation when due, the progress bar).

A task's run subclasses it with its phases: ``warm_start(bar)``, ``evaluate(rl_step)`` and
``rl(bar)``; the loop (``runner``) calls them, then ``aclose()``.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from arctic_rl_demo.run_log import RunLog


class TaskRun(ABC):
    """One run's state: settings, client, tokenizer, RNG, log (``metrics.jsonl`` and the
    trackers), the last held-out score and the warm start's checkpoint."""

    step_seconds_format = ".2f"  # the progress bar's step time

    def __init__(self, settings: Any, client: Any, tokenizer: Any, out: Path) -> None:
        self.settings = settings
        self.client = client
        self.tokenizer = tokenizer
        self.rng = random.Random(settings.seed)
        self.mistakes = random.Random(f"demo-mistakes-{settings.seed}")
        self.run_log = RunLog(out, settings, settings.report_to, settings.warm_steps)
        self.records = self.run_log.records
        self.last_eval = 0.0
        self.sft_checkpoint: str | None = None

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """One record to ``metrics.jsonl``, the in-memory history and the trackers."""
        return self.run_log.write(record)

    async def aclose(self) -> None:
        """Close the run's log (metrics file and trackers)."""
        self.run_log.close()

    @abstractmethod
    async def evaluate(self, rl_step: int) -> float:
        """The held-out score with the served weights (greedy), logged."""

    def habits(self, count: int) -> list[bool] | None:
        """For ``count`` demonstrations, which show the demonstrator's habit (a
        ``demo_mistakes`` share, drawn from their own seeded stream so that the rest of the run
        draws as it would without); ``None`` when the share is 0."""
        share = self.settings.demo_mistakes
        if not share:
            return None
        return [self.mistakes.random() < share for _ in range(count)]

    async def sft_step(
        self, step: int, batch: dict[str, Any], started: float, **extra: Any
    ) -> dict[str, Any]:
        """One supervised (``cross_entropy``) step on ``batch`` at the warm-start learning rate;
        its record (``extra`` after the step, seconds since ``started``) is logged."""
        metrics = await self.client.fwd_bwd(batch, "cross_entropy")
        stepped = await self.client.step(learning_rate=self.settings.sft_learning_rate)
        return self.log(
            {
                "phase": "sft",
                "step": step,
                **extra,
                "loss": float(metrics.get("loss", 0.0)),
                "grad_norm": stepped.get("grad_norm"),
                "seconds": time.monotonic() - started,
            }
        )

    async def save_warm_start(self) -> int:
        """Save the warm-started weights (checkpoint tag ``sft``) and sync them to the sampler;
        returns the sampler's new weight version."""
        self.sft_checkpoint = await self.client.save_checkpoint(tag="sft")
        synced = await self.client.sync_weights()
        return int(synced["weight_version"])

    def loss_config(self) -> dict[str, Any]:
        """The GRPO loss's config: the k3 KL estimator, and the rollout correction unless
        ``correction`` is ``none`` (the trainer's own log-probs are then the old policy)."""
        config: dict[str, Any] = {"kl_estimator": "k3"}
        if self.settings.correction != "none":
            config["rollout_correction"] = self.settings.correction
        return config

    async def end_step(self, record: dict[str, Any], bar: Any, **postfix: str) -> None:
        """After a logged GRPO step: a held-out evaluation when one is due (every
        ``eval_every`` steps, the final one aside), then the progress bar."""
        s = self.settings
        step = record["step"]
        if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < s.steps:
            self.last_eval = await self.evaluate(step + 1)
        bar.update(1)
        seconds = format(record["seconds"]["total"], self.step_seconds_format)
        bar.set_postfix(
            {
                "reward": f"{record['reward_mean']:.2f}",
                "heldout": f"{self.last_eval:.2f}",
                "step_s": seconds,
                **postfix,
            }
        )
