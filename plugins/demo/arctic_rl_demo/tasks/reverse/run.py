"""One reverse-task run's state and phases (``DemoRun``).

``DemoRun`` drives the public ``AsyncArcticRLClient``: the supervised warm start, held-out
evaluations, rollouts, and one GRPO update a step (the synchronous loop is ``rl_sync``; the
``--async`` one is ``async_loop``). Every record goes to ``metrics.jsonl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from arctic_rl_demo.mismatch import mismatch_record
from arctic_rl_demo.task_run import TaskRun
from arctic_rl_demo.tasks.reverse.rollouts import Rollout, exact_fraction, grpo_batch, sft_batch
from arctic_rl_demo.tasks.reverse.settings import DemoSettings
from arctic_rl_demo.tasks.reverse.task import ReverseDigitsTask


class DemoRun(TaskRun):
    """One reverse-task run: the shared state, the task, weight versions and overlap windows."""

    settings: DemoSettings

    def __init__(self, settings: DemoSettings, client: Any, tokenizer: Any, out: Path) -> None:
        self.task = ReverseDigitsTask(
            digits=settings.digits,
            heldout_size=settings.heldout_size,
            train_reward_kind=settings.reward,
        )
        super().__init__(settings, client, tokenizer, out)
        self.weight_version = 0
        self.dropped_stale = 0
        self.train_windows: list[tuple[float, float]] = []
        self.heldout_prompt_ids = [self.encode(p) for p, _ in self.task.heldout]

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt (the same ids go to ``generate`` and into the batches)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # --- phases ---------------------------------------------------------------------------

    async def rl(self, bar: Any) -> None:
        """The GRPO phase: the synchronous loop, or the ``--async`` pipeline."""
        if self.settings.async_mode:
            from arctic_rl_demo.tasks.reverse.async_loop import rl_async

            await rl_async(self, bar)
        else:
            await self.rl_sync(bar)

    async def warm_start(self, bar: Any = None) -> None:
        """Supervised steps on task demonstrations, then save a checkpoint and sync."""
        s = self.settings
        for i in range(s.sft_steps):
            t0 = time.monotonic()
            pairs = self.task.prompts(s.sft_batch_size, self.rng)
            batch = sft_batch(self.task, pairs, self.tokenizer, self.habits(len(pairs)))
            await self.sft_step(i, batch, t0)
            if bar is not None:
                bar.update(1)
        self.weight_version = await self.save_warm_start()

    async def evaluate(self, rl_step: int) -> float:
        """Greedy exact match on the held-out prompts with the served weights; logged."""
        t0 = time.monotonic()
        gen = await self.client.generate(
            self.heldout_prompt_ids,
            {"n": 1, "max_tokens": self.settings.max_tokens, "temperature": 0.0},
        )
        exact = exact_fraction(self.task, gen["outputs"], self.task.heldout)
        versions = {int(o["completions"][0].get("weight_version_start", 0)) for o in gen["outputs"]}
        self.log(
            {
                "phase": "eval",
                "rl_step": rl_step,
                "heldout_exact": exact,
                "weight_versions": sorted(versions),
                "seconds": time.monotonic() - t0,
            }
        )
        return exact

    async def rollout(self, index: int, pairs: list[tuple[str, str]]) -> Rollout:
        """Sample ``samples_per_prompt`` completions per prompt with the served weights."""
        s = self.settings
        launched, t0 = self.weight_version, time.monotonic()
        gen = await self.client.generate(
            [self.encode(p) for p, _ in pairs],
            {
                "n": s.samples_per_prompt,
                "max_tokens": s.max_tokens,
                "temperature": 1.0,
                "seed": s.seed * 100003 + index,
            },
        )
        t1 = time.monotonic()
        rollout = Rollout(
            index, pairs, gen["outputs"], t1 - t0, window=(t0, t1), launched_version=launched
        )
        rollout.score(self.task)
        return rollout

    def draw(self) -> list[tuple[str, str]]:
        """The next step's training prompts (drawn in step order in both modes)."""
        return self.task.prompts(self.settings.prompts_per_step, self.rng)

    async def train(
        self, rollout: Rollout, step: int, strategy: str, timings: dict[str, float]
    ) -> dict[str, Any]:
        """One GRPO update on ``rollout``, then the new weights to the sampler."""
        s = self.settings

        async def timed(name: str, coro: Any) -> Any:
            t0 = time.monotonic()
            try:
                return await coro
            finally:
                timings[name] = timings.get(name, 0.0) + time.monotonic() - t0

        started = time.monotonic()
        batch = grpo_batch(rollout, s.samples_per_prompt)
        loss_config = self.loss_config()
        if s.kl_coef > 0:
            batch["ref_log_probs"] = await timed(
                "ref_log_probs",
                self.client.fwd_no_grad({"input_ids": batch["input_ids"]}, reference_model=True),
            )
            loss_config["kl_coef"] = s.kl_coef
        metrics: dict[str, Any] = {}
        stepped: dict[str, Any] = {}
        # A batch whose groups all agree has no gradient; an optimizer step on it would
        # still move the weights along Adam's momentum, so it is skipped.
        if any(a != 0 for a in batch["advantages"]):
            metrics = await timed("fwd_bwd", self.client.fwd_bwd(batch, "grpo", loss_config))
            stepped = await timed("step", self.client.step(learning_rate=s.learning_rate))
        else:  # no update, but the step's mismatch is still measured (a forward only)
            metrics = await timed(
                "fwd_bwd",
                self.client.fwd_bwd(batch, "grpo", loss_config, forward_only=True),
            )
        synced = await timed("sync_weights", self.client.sync_weights(strategy=strategy))
        self.train_windows.append((started, time.monotonic()))
        oldest, newest = rollout.versions
        staleness = self.weight_version - oldest
        launch_staleness = self.weight_version - rollout.launched_version
        self.weight_version = int(synced["weight_version"])
        rewards = rollout.rewards
        return {
            "phase": "rl",
            "step": step,
            "reward_mean": sum(rewards) / len(rewards),
            "loss": float(metrics.get("loss", 0.0)),
            "kl": float(metrics.get("kl", 0.0) or 0.0),
            "ratio": float(metrics.get("ratio", 1.0) or 1.0),
            "clip_fraction": float(metrics.get("clip_frac", 0.0) or 0.0),
            **mismatch_record(metrics),
            "grad_norm": stepped.get("grad_norm"),
            "lr": stepped.get("lr"),
            "completion_tokens": sum(sum(m) for m in batch["loss_mask"]),
            "sampled_versions": [oldest, newest],
            "staleness": staleness,
            "launch_staleness": launch_staleness,
            "weight_version": self.weight_version,
            "sync_bytes": int(synced.get("bytes", 0) or 0),
            "generation_overlap_seconds": self.overlap_with_training(rollout),
            "sample": rollout.completions[0]["text"],
        }

    def overlap_with_training(self, rollout: Rollout) -> float:
        """Seconds ``rollout`` was generated while an earlier GRPO update trained (0 in the
        synchronous loop, which never samples during an update)."""
        start, end = rollout.window
        return sum(
            max(0.0, min(end, t_end) - max(start, t_start)) for t_start, t_end in self.train_windows
        )

    async def rl_sync(self, bar: Any) -> None:
        """The synchronous loop: each step samples with the weights the last step made."""
        for step in range(self.settings.steps):
            t0 = time.monotonic()
            rollout = await self.rollout(step, self.draw())
            timings = {"generate": rollout.seconds}
            record = await self.train(rollout, step, "drain", timings)
            timings["total"] = time.monotonic() - t0
            await self.after_step(record, timings, bar)

    async def after_step(self, record: dict[str, Any], timings: dict[str, float], bar: Any) -> None:
        """Log a step, run a held-out evaluation when due, update the progress bar."""
        record["seconds"] = timings
        self.log(record)
        stale = {"stale": str(record["staleness"])} if self.settings.async_mode else {}
        await self.end_step(record, bar, **stale)
