"""``arctic-rl demo``: SFT warm start then GRPO on the digit-reversal task, on this machine's CPU.

Builds the tiny model, starts the local backend (logical GPUs in CPU mode) and, through the
public ``AsyncArcticRLClient`` only: a supervised warm start (``fwd_bwd`` with
``cross_entropy`` on demonstrations, checkpoint saved), then GRPO on the exact-match reward
(generate → rewards → group advantages → ``fwd_bwd(loss_fn="grpo")`` with the sampler's
behaviour log-probs → ``step`` → ``sync_weights``). A fixed held-out set is scored by greedy
exact match before and after the warm start and every ``eval_every`` RL steps. With
``async_mode`` rollouts for later steps are generated while a step trains (``demo_async``).
Writes ``metrics.jsonl``, ``reward.png``, ``summary.md`` and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arctic_platform.rl.demo_rollouts import Rollout, exact_fraction, grpo_batch, sft_batch
from arctic_platform.rl.demo_task import ReverseDigitsTask

MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
}


@dataclass
class DemoSettings:
    """What one demo run does (``steps`` counts RL steps; the warm start has its own)."""

    steps: int = 80
    sft_steps: int = 40
    sft_batch_size: int = 32
    sft_learning_rate: float = 2e-3
    prompts_per_step: int = 16
    samples_per_prompt: int = 16
    max_tokens: int = 8
    learning_rate: float = 1e-3
    kl_coef: float = 0.0
    eval_every: int = 10
    digits: int = 4
    heldout_size: int = 128
    async_mode: bool = False
    max_staleness: int = 1
    model_size: str = "tiny"
    transport: str = "http"
    colocate: bool = False
    output_dir: Path = field(
        default_factory=lambda: Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    )
    seed: int = 0
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1 or self.sft_steps < 0:
            raise ValueError(f"steps={self.steps} must be >= 1 and sft_steps >= 0")
        if self.async_mode and self.max_staleness < 1:
            raise ValueError(
                f"max_staleness={self.max_staleness}: the async pipeline needs at least 1 "
                "(0 is the synchronous loop: leave out --async)"
            )
        if self.model_size not in MODEL_SIZES:
            raise ValueError(f"model_size {self.model_size!r} is not one of {list(MODEL_SIZES)}")


class DemoRun:
    """One demo run's state: client, task, tokenizer, RNG, metrics file and counters."""

    def __init__(self, settings: DemoSettings, client: Any, tokenizer: Any, out: Path) -> None:
        self.settings = settings
        self.client = client
        self.tokenizer = tokenizer
        self.task = ReverseDigitsTask(digits=settings.digits, heldout_size=settings.heldout_size)
        self.rng = random.Random(settings.seed)
        self.metrics_file = (out / "metrics.jsonl").open("w")
        self.records: list[dict[str, Any]] = []
        self.weight_version = 0
        self.last_eval = 0.0
        self.dropped_stale = 0
        self.sft_checkpoint: str | None = None
        self.heldout_prompt_ids = [self.encode(p) for p, _ in self.task.heldout]

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt (the same ids go to ``generate`` and into the batches)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append one record to ``metrics.jsonl`` and to the in-memory history."""
        self.records.append(record)
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        return record

    # --- phases ---------------------------------------------------------------------------

    async def warm_start(self) -> None:
        """Supervised steps on task demonstrations, then save a checkpoint and sync."""
        s = self.settings
        for i in range(s.sft_steps):
            t0 = time.monotonic()
            pairs = self.task.prompts(s.sft_batch_size, self.rng)
            batch = sft_batch(self.task, pairs, self.tokenizer)
            metrics = await self.client.fwd_bwd(batch, "cross_entropy")
            stepped = await self.client.step(learning_rate=s.sft_learning_rate)
            self.log(
                {
                    "phase": "sft",
                    "step": i,
                    "loss": float(metrics.get("loss", 0.0)),
                    "grad_norm": stepped.get("grad_norm"),
                    "seconds": time.monotonic() - t0,
                }
            )
        self.sft_checkpoint = await self.client.save_checkpoint(tag="sft")
        synced = await self.client.sync_weights()
        self.weight_version = int(synced["weight_version"])

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
        t0 = time.monotonic()
        gen = await self.client.generate(
            [self.encode(p) for p, _ in pairs],
            {
                "n": s.samples_per_prompt,
                "max_tokens": s.max_tokens,
                "temperature": 1.0,
                "seed": s.seed * 100003 + index,
            },
        )
        rollout = Rollout(index, pairs, gen["outputs"], time.monotonic() - t0)
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

        batch = grpo_batch(rollout, s.samples_per_prompt)
        loss_config: dict[str, Any] = {"kl_estimator": "k3"}
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
        synced = await timed("sync_weights", self.client.sync_weights(strategy=strategy))
        oldest, newest = rollout.versions
        staleness = self.weight_version - oldest
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
            "grad_norm": stepped.get("grad_norm"),
            "lr": stepped.get("lr"),
            "completion_tokens": sum(sum(m) for m in batch["loss_mask"]),
            "sampled_versions": [oldest, newest],
            "staleness": staleness,
            "weight_version": self.weight_version,
            "sample": rollout.completions[0]["text"],
        }

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
        s = self.settings
        record["seconds"] = timings
        step = record["step"]
        self.log(record)
        if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < s.steps:
            self.last_eval = await self.evaluate(step + 1)
        bar.update(1)
        postfix = {
            "reward": f"{record['reward_mean']:.2f}",
            "heldout": f"{self.last_eval:.2f}",
            "step_s": f"{timings['total']:.2f}",
        }
        if s.async_mode:
            postfix["stale"] = str(record["staleness"])
        bar.set_postfix(postfix)


def run_demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the demo end to end; returns the summary (also written as ``summary.json``)."""
    return asyncio.run(_run(settings))


def _config(settings: DemoSettings, model: Path) -> Any:
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.network import LOOPBACK, free_port
    from arctic_platform.rl.plugins import get_registry

    # a transport on host:port gets loopback and a free port, so two demos never collide
    network = get_registry().get("transport", settings.transport).network_address
    return ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol=settings.transport,
        host=LOOPBACK if network else None,
        port=free_port() if network else None,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=0,
        colocate=settings.colocate,
        ray_auto_attach=False,
        server_logs=False,
        seed=settings.seed,
        training_config={
            "optimizer": {
                "lr": settings.learning_rate,
                "weight_decay": 0.0,
                "gradient_clipping": 1.0,
            },
        },
    )


async def _run(settings: DemoSettings) -> dict[str, Any]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from arctic_platform.rl.client import AsyncArcticRLClient
    from arctic_platform.rl.demo_async import rl_async
    from arctic_platform.rl.testing import build_tiny_model

    s = settings
    out_dir = s.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ARCTIC_RL_HOME", str(out_dir / ".arctic_rl"))
    # vLLM's CPU auto-binding pins the sampler's OpenMP threads to cores it picks; one
    # unpinned thread per engine let generation and training overlap on a 2-core machine
    # (bench/async_pipeline.py measured it).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    size = MODEL_SIZES[s.model_size]
    model = build_tiny_model(
        out_dir / f"model-{s.model_size}",
        hidden_size=size["hidden_size"],
        num_layers=size["num_layers"],
        num_heads=size["num_heads"],
        seed=s.seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    print(f"arctic-rl demo: output in {out_dir}", file=sys.stderr)
    started = time.monotonic()
    client = await AsyncArcticRLClient.create(_config(s, model), progress=not s.quiet)
    setup_seconds = time.monotonic() - started
    run = DemoRun(s, client, tokenizer, out_dir)
    seconds: dict[str, float] = {"setup": setup_seconds}
    try:
        t0 = time.monotonic()
        before = await run.evaluate(-1)
        await run.warm_start()
        after_sft = await run.evaluate(0)
        seconds["sft"] = time.monotonic() - t0
        run.last_eval = after_sft
        t0 = time.monotonic()
        mode = "async" if s.async_mode else "sync"
        with tqdm(total=s.steps, desc=f"GRPO ({mode})", file=sys.stderr, disable=s.quiet) as bar:
            if s.async_mode:
                await rl_async(run, bar)
            else:
                await run.rl_sync(bar)
        seconds["rl"] = time.monotonic() - t0
        final = await run.evaluate(s.steps)
    finally:
        run.metrics_file.close()
        await client.shutdown()
    seconds["total"] = time.monotonic() - started
    summary = _summarize(run, before, after_sft, final, seconds)
    _plot(run.records, s, out_dir / "reward.png")
    (out_dir / "summary.md").write_text(_summary_table(summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not s.quiet:
        print(_summary_table(summary))
    return summary


def _summarize(
    run: DemoRun, before: float, after_sft: float, final: float, seconds: dict[str, float]
) -> dict[str, Any]:
    s = run.settings
    rl = [r for r in run.records if r["phase"] == "rl"]
    evals = [r for r in run.records if r["phase"] == "eval"]
    rewards = [r["reward_mean"] for r in rl]
    k = min(10, len(rewards))
    phases: dict[str, float] = {}
    for r in rl:
        for name, sec in r["seconds"].items():
            phases[name] = phases.get(name, 0.0) + sec
    rl_step_seconds = phases.get("total", 0.0)
    n = max(1, len(rl))
    staleness = [r["staleness"] for r in rl]
    settings = {key: str(v) if isinstance(v, Path) else v for key, v in asdict(s).items()}
    return {
        "mode": "async" if s.async_mode else "sync",
        "max_staleness": s.max_staleness if s.async_mode else 0,
        "sft_steps": s.sft_steps,
        "steps": len(rl),
        "heldout_size": len(run.task.heldout),
        "heldout_exact_before_sft": before,
        "heldout_exact_after_sft": after_sft,
        "heldout_exact_final": final,
        "heldout_gain_from_rl": final - after_sft,
        "heldout_curve": [[r["rl_step"], r["heldout_exact"]] for r in evals if r["rl_step"] >= 0],
        "first10_reward": sum(rewards[:k]) / k if k else 0.0,
        "last10_reward": sum(rewards[-k:]) / k if k else 0.0,
        "staleness_max": max(staleness, default=0),
        "staleness_mean": sum(staleness) / n,
        "dropped_stale_rollouts": run.dropped_stale,
        "rollouts_across_a_hotswap": sum(
            1 for r in rl if r["sampled_versions"][0] != r["sampled_versions"][1]
        ),
        "mean_importance_ratio": sum(r["ratio"] for r in rl) / n,
        "sft_checkpoint": run.sft_checkpoint,
        "setup_seconds": seconds["setup"],
        "sft_seconds": seconds.get("sft", 0.0),
        "rl_seconds": seconds.get("rl", 0.0),
        "rl_step_seconds": rl_step_seconds,
        "rl_steps_per_second": len(rl) / rl_step_seconds if rl_step_seconds > 0 else 0.0,
        "eval_seconds": sum(r["seconds"] for r in evals),
        "total_seconds": seconds["total"],
        "mean_step_seconds_by_phase": {name: sec / n for name, sec in phases.items()},
        "settings": settings,
    }


def _summary_table(summary: dict[str, Any]) -> str:
    mode = summary["mode"]
    if mode == "async":
        mode += f" (max staleness {summary['max_staleness']})"
    lines = [
        "| metric | value |",
        "|---|---|",
        f"| mode | {mode} |",
        f"| SFT steps, then GRPO steps | {summary['sft_steps']}, {summary['steps']} |",
        f"| held-out exact match before SFT | {summary['heldout_exact_before_sft']:.3f} |",
        f"| held-out exact match after SFT | {summary['heldout_exact_after_sft']:.3f} |",
        f"| held-out exact match, final | {summary['heldout_exact_final']:.3f} |",
        f"| held-out prompts (greedy, never trained on) | {summary['heldout_size']} |",
        f"| train reward (exact), first 10 RL steps | {summary['first10_reward']:.3f} |",
        f"| train reward (exact), last 10 RL steps | {summary['last10_reward']:.3f} |",
        f"| staleness, max / mean (versions) | {summary['staleness_max']} / "
        f"{summary['staleness_mean']:.2f} |",
        f"| set-up (server, Ray, engines) | {summary['setup_seconds']:.1f} s |",
        f"| SFT phase (with 2 evaluations) | {summary['sft_seconds']:.1f} s |",
        f"| RL phase | {summary['rl_seconds']:.1f} s |",
        f"| RL steps per second (evaluations excluded) | {summary['rl_steps_per_second']:.3f} |",
        f"| total | {summary['total_seconds']:.1f} s |",
    ]
    for name, sec in summary["mean_step_seconds_by_phase"].items():
        lines.append(f"| RL step time: {name} | {sec:.3f} s |")
    return "\n".join(lines) + "\n"


def _plot(records: list[dict[str, Any]], settings: DemoSettings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft = settings.sft_steps
    rl = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(
        [sft + r["step"] + 1 for r in rl],
        [r["reward_mean"] for r in rl],
        label="train reward (exact match of samples, T=1)",
        alpha=0.7,
    )
    ax.plot(
        [0 if r["rl_step"] < 0 else sft + r["rl_step"] for r in evals],
        [r["heldout_exact"] for r in evals],
        "o-",
        label=f"held-out exact match (greedy, {settings.heldout_size} prompts)",
    )
    ax.axvline(sft, color="grey", linestyle="--")
    ax.text(sft, 1.02, " SFT | GRPO", color="grey", va="bottom", ha="center")
    mode = "async, one-step off-policy" if settings.async_mode else "sync"
    ax.set_xlabel("optimizer step (SFT steps, then GRPO steps)")
    ax.set_ylabel("exact match")
    ax.set_title(
        f"Arctic RL demo: reverse {settings.digits} digits, {settings.model_size} model, CPU "
        f"({mode})",
        pad=18,
    )
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
