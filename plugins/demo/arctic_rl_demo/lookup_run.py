"""One lookup-demo run: its settings (``LookupSettings``) and its phases (``LookupRun``).

``LookupRun`` drives the public ``AsyncArcticRLClient``: the supervised warm start on rendered
demonstrations, held-out evaluations through the agent path (greedy), and GRPO steps whose
rollouts are openai-agents runs in sessions and whose batch is the sessions' trajectories.
Every record goes to ``metrics.jsonl``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arctic_rl_demo.lookup_agent import AgentPlayer, EpisodeResult
from arctic_rl_demo.lookup_grpo import grpo_batch
from arctic_rl_demo.lookup_sft import prompt_ids, sft_batch
from arctic_rl_demo.lookup_task import LookupTask
from arctic_rl_demo.run_log import RunLog, check_report_to
from arctic_rl_demo.runner import MODEL_SIZES
from arctic_rl_demo.task import CORRECTION_CHOICES, mismatch_record


@dataclass
class LookupSettings:
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
    sft_short_steps: int = 200
    sft_steps: int = 24
    sft_batch_size: int = 32
    sft_learning_rate: float = 2e-3
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_tokens: int = 32
    learning_rate: float = 5e-4
    correction: str = "bypass"  # a rollout-correction preset, or "none"
    eval_every: int = 5
    digits: int = 4
    heldout_size: int = 64
    model_size: str = "tiny"
    transport: str = "http"
    colocate: bool = False
    output_dir: Path = field(
        default_factory=lambda: Path("runs") / time.strftime("demo-lookup-%Y%m%d-%H%M%S")
    )
    seed: int = 0
    quiet: bool = False
    report_to: tuple[str, ...] = ()  # experiment trackers (--report-to), beside metrics.jsonl

    def __post_init__(self) -> None:
        self.report_to = check_report_to(self.report_to)
        if self.steps < 1 or self.sft_steps < 0 or self.sft_short_steps < 0:
            raise ValueError(
                f"steps={self.steps} must be >= 1, sft_steps={self.sft_steps} and "
                f"sft_short_steps={self.sft_short_steps} >= 0"
            )
        if self.samples_per_prompt < 2:
            raise ValueError("GRPO needs samples_per_prompt >= 2 (group-normalised rewards)")
        if self.transport != "http":
            raise ValueError("the lookup demo needs the http transport (agent sessions' URLs)")
        if self.model_size not in MODEL_SIZES:
            raise ValueError(f"model_size {self.model_size!r} is not one of {list(MODEL_SIZES)}")
        if self.correction not in CORRECTION_CHOICES:
            raise ValueError(
                f"correction {self.correction!r} is not one of {list(CORRECTION_CHOICES)}"
            )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class LookupRun:
    """One run's state: client, task, tokenizer, agent player, RNG and metrics file."""

    def __init__(self, settings: LookupSettings, client: Any, tokenizer: Any, out: Path) -> None:
        self.settings = settings
        self.client = client
        self.tokenizer = tokenizer
        self.task = LookupTask(digits=settings.digits, heldout_size=settings.heldout_size)
        self.player = AgentPlayer(client, self.task, settings.max_tokens)
        self.rng = random.Random(settings.seed)
        warm_steps = settings.sft_short_steps + settings.sft_steps
        self.run_log = RunLog(out, settings, settings.report_to, warm_steps)
        self.records = self.run_log.records
        self.last_eval = 0.0
        self.sft_checkpoint: str | None = None

    async def aclose(self) -> None:
        """Close the metrics file and the agent player's connections."""
        self.run_log.close()
        await self.player.aclose()

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """One record to ``metrics.jsonl``, the in-memory history and the trackers."""
        return self.run_log.write(record)

    async def warm_start(self, bar: Any = None) -> None:
        """Supervised steps on rendered demonstrations (short ones first, then full-length),
        then a checkpoint and a weight sync."""
        s = self.settings
        phases = [False] * s.sft_short_steps + [True] * s.sft_steps
        for i, with_tools in enumerate(phases):
            t0 = time.monotonic()
            episodes = self.task.episodes(s.sft_batch_size, self.rng)
            batch = sft_batch(self.tokenizer, episodes, with_tools)
            metrics = await self.client.fwd_bwd(batch, "cross_entropy")
            stepped = await self.client.step(learning_rate=s.sft_learning_rate)
            record = self.log(
                {
                    "phase": "sft",
                    "step": i,
                    "tool_block": with_tools,
                    "loss": float(metrics.get("loss", 0.0)),
                    "grad_norm": stepped.get("grad_norm"),
                    "seconds": time.monotonic() - t0,
                }
            )
            if bar is not None:
                bar.update(1)
                bar.set_postfix({"loss": f"{record['loss']:.3f}", "full": with_tools})
        if phases:
            self.sft_checkpoint = await self.client.save_checkpoint(tag="sft")
            await self.client.sync_weights()

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
            loss_config: dict[str, Any] = {"kl_estimator": "k3"}
            if s.correction != "none":
                loss_config["rollout_correction"] = s.correction
            metrics = await self.client.fwd_bwd(batch, "grpo", loss_config)
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
        s = self.settings
        for step in range(s.steps):
            record = await self.rl_step(step)
            if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < s.steps:
                self.last_eval = await self.evaluate(step + 1)
            bar.update(1)
            bar.set_postfix(
                {
                    "reward": f"{record['reward_mean']:.2f}",
                    "heldout": f"{self.last_eval:.2f}",
                    "step_s": f"{record['seconds']['total']:.1f}",
                }
            )


def _sample(result: EpisodeResult) -> dict[str, Any]:
    return {
        "key": result.episode.key,
        "value": result.episode.value,
        "called": result.called_key,
        "answer": result.final_output,
        "error": result.error,
    }
