"""One lookup-task run's state and phases (``LookupRun``).

``LookupRun`` drives the public ``AsyncArcticRLClient``: the supervised warm start on rendered
demonstrations, held-out evaluations through the agent path (greedy), and GRPO steps whose
rollouts are openai-agents runs in sessions and whose batch is the sessions' trajectories.
Every record goes to ``metrics.jsonl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from arctic_rl_demo.mismatch import mismatch_record
from arctic_rl_demo.task_run import TaskRun
from arctic_rl_demo.tasks.lookup.agent import AgentPlayer, EpisodeResult
from arctic_rl_demo.tasks.lookup.grpo import grpo_batch
from arctic_rl_demo.tasks.lookup.settings import LookupSettings
from arctic_rl_demo.tasks.lookup.sft import prompt_ids, sft_batch
from arctic_rl_demo.tasks.lookup.task import Episode, LookupTask, wordy_answer


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class LookupRun(TaskRun):
    """One lookup-task run: the shared state, the task and the agent player."""

    settings: LookupSettings
    step_seconds_format = ".1f"

    def __init__(self, settings: LookupSettings, client: Any, tokenizer: Any, out: Path) -> None:
        self.task = LookupTask(digits=settings.digits, heldout_size=settings.heldout_size)
        self.player = AgentPlayer(client, self.task, settings.max_tokens)
        super().__init__(settings, client, tokenizer, out)

    async def aclose(self) -> None:
        """Close the metrics file and the agent player's connections."""
        await super().aclose()
        await self.player.aclose()

    async def warm_start(self, bar: Any = None) -> None:
        """Supervised steps on rendered demonstrations (short ones first, then full-length),
        then a checkpoint and a weight sync."""
        s = self.settings
        phases = [False] * s.sft_short_steps + [True] * s.sft_steps
        for i, with_tools in enumerate(phases):
            t0 = time.monotonic()
            episodes = self.task.episodes(s.sft_batch_size, self.rng)
            batch = sft_batch(self.tokenizer, episodes, with_tools, self._shown_answers(episodes))
            record = await self.sft_step(i, batch, t0, tool_block=with_tools)
            if bar is not None:
                bar.update(1)
                bar.set_postfix({"loss": f"{record['loss']:.3f}", "full": with_tools})
        if phases:
            await self.save_warm_start()

    def _shown_answers(self, episodes: list[Episode]) -> list[str | None] | None:
        """Per demonstration the answer shown: for a ``demo_mistakes`` share of them the value
        in a sentence (``wordy_answer``), drawn from their own seeded stream so that the rest
        of the run draws as it would without."""
        habits = self.habits(len(episodes))
        if habits is None:
            return None
        return [wordy_answer(e) if h else None for e, h in zip(episodes, habits, strict=True)]

    async def evaluate(self, rl_step: int) -> float:
        """Greedy success on the held-out episodes through the agent path; logged."""
        t0 = time.monotonic()
        results = await self.player.play_all(self.task.heldout, 0.0, keep_batch=rl_step < 0)
        if rl_step < 0:
            self.check_rendering(results)
        success = _mean([r.reward for r in results])
        self.log(
            {
                "phase": "eval",
                "rl_step": rl_step,
                "heldout_success": success,
                "heldout_key_right": _mean([float(r.key_right) for r in results]),
                "errors": sum(1 for r in results if r.error),
                "sample": _sample(results[0]),
                "seconds": time.monotonic() - t0,
            }
        )
        return success

    def check_rendering(self, results: list[EpisodeResult]) -> None:
        """Demonstrations must begin exactly like a real session's turn 1, else SFT would teach
        a format the agent never sees."""
        for result in results:
            rows = result.batch.get("input_ids") or []
            if rows:
                expected = prompt_ids(self.tokenizer, result.episode)
                if rows[0][: len(expected)] != expected:
                    raise RuntimeError(
                        "a session's turn-1 prompt differs from the demonstrations' rendering "
                        "(the openai-agents tool schema or instructions changed?)"
                    )
                return

    async def rl_step(self, step: int) -> dict[str, Any]:
        """Rollouts in sessions, group advantages, one GRPO update, then a weight sync."""
        s = self.settings
        t0 = time.monotonic()
        episodes = [
            e
            for e in self.task.episodes(s.prompts_per_step, self.rng)
            for _ in range(s.samples_per_prompt)
        ]
        results = await self.player.play_all(episodes, 1.0, keep_batch=True)
        t1 = time.monotonic()
        batch = grpo_batch(results, s.samples_per_prompt)
        metrics: dict[str, Any] = {}
        stepped: dict[str, Any] = {}
        # A batch whose groups all agree has no gradient; Adam would still move the weights.
        if batch["input_ids"]:
            metrics = await self.client.fwd_bwd(batch, "grpo", self.loss_config())
            stepped = await self.client.step(learning_rate=s.learning_rate)
        t2 = time.monotonic()
        await self.client.sync_weights()
        t3 = time.monotonic()
        rewards = [r.reward for r in results]
        return self.log(
            {
                "phase": "rl",
                "step": step,
                "reward_mean": _mean(rewards),
                "key_right": _mean([float(r.key_right) for r in results]),
                "errors": sum(1 for r in results if r.error),
                "trained_rows": len(batch["input_ids"]),
                "loss": float(metrics.get("loss", 0.0)),
                "ratio": float(metrics.get("ratio", 1.0) or 1.0),
                **mismatch_record(metrics),
                "grad_norm": stepped.get("grad_norm"),
                "sample": _sample(results[0]),
                "seconds": {
                    "rollouts": t1 - t0,
                    "train": t2 - t1,
                    "sync_weights": t3 - t2,
                    "total": t3 - t0,
                },
            }
        )

    async def rl(self, bar: Any) -> None:
        """The GRPO loop with held-out evaluations every ``eval_every`` steps."""
        for step in range(self.settings.steps):
            await self.end_step(await self.rl_step(step), bar)


def _sample(result: EpisodeResult) -> dict[str, Any]:
    return {
        "key": result.episode.key,
        "value": result.episode.value,
        "called": result.called_key,
        "answer": result.final_output,
        "error": result.error,
    }
