"""``arctic-rl demo``: GRPO from scratch on the digit-sum task, on this machine's CPU.

Builds the tiny model, starts the local backend (logical GPUs in CPU mode) and runs the
loop: generate → rewards → group advantages → old/ref log-probs → fwd_bwd + step → sync.
Writes ``metrics.jsonl``, ``reward.png`` and ``summary.md`` to the output directory.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arctic_platform.rl.demo_task import DigitSumTask, group_advantages

MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
}


@dataclass
class DemoSettings:
    """What one demo run does."""

    steps: int = 60
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    max_tokens: int = 6
    learning_rate: float = 2e-3
    kl_coef: float = 0.0
    model_size: str = "tiny"
    transport: str = "http"
    colocate: bool = False
    output_dir: Path = field(
        default_factory=lambda: Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    )
    seed: int = 0
    quiet: bool = False


def _rows(outputs: list[dict[str, Any]]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    rows, masks, prompt_lengths = [], [], []
    for out in outputs:
        prompt = list(out["prompt_token_ids"])
        for completion in out["completions"]:
            tokens = list(completion["token_ids"]) or []
            rows.append(prompt + tokens)
            masks.append([0] * len(prompt) + [1] * len(tokens))
            prompt_lengths.append(len(prompt))
    return rows, masks, prompt_lengths


def run_demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the GRPO demo; returns the summary (first/last-5 mean reward, timings)."""
    from tqdm import tqdm

    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.server.jobs import free_port
    from arctic_platform.rl.testing import build_tiny_model

    out_dir = settings.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ARCTIC_RL_HOME", str(out_dir / ".arctic_rl"))
    size = MODEL_SIZES[settings.model_size]
    model = build_tiny_model(
        out_dir / f"model-{settings.model_size}",
        hidden_size=size["hidden_size"],
        num_layers=size["num_layers"],
        num_heads=size["num_heads"],
        seed=settings.seed,
    )
    config = ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol=settings.transport,
        host="127.0.0.1" if settings.transport == "http" else None,
        port=free_port() if settings.transport == "http" else None,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
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
    task = DigitSumTask()
    rng = random.Random(settings.seed)
    metrics_path = out_dir / "metrics.jsonl"
    history: list[dict[str, Any]] = []
    print(f"arctic-rl demo: output in {out_dir}", file=sys.stderr)
    started = time.monotonic()
    client = ArcticRLClient(config, progress=not settings.quiet)
    setup_seconds = time.monotonic() - started
    try:
        bar = tqdm(range(settings.steps), desc="GRPO", file=sys.stderr, disable=settings.quiet)
        with metrics_path.open("w") as metrics_file:
            for step in bar:
                record = _one_step(client, task, rng, settings, step)
                history.append(record)
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                bar.set_postfix(
                    reward=f"{record['reward_mean']:.3f}",
                    loss=f"{record['loss']:.3f}",
                    kl=f"{record['kl']:.4f}",
                    step_s=f"{record['seconds']['total']:.2f}",
                )
    finally:
        client.shutdown()
    summary = _summarize(history, setup_seconds, time.monotonic() - started)
    _plot(history, out_dir / "reward.png")
    (out_dir / "summary.md").write_text(_summary_table(summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not settings.quiet:
        print(_summary_table(summary))
    return summary


def _one_step(
    client: Any, task: DigitSumTask, rng: random.Random, settings: DemoSettings, step: int
) -> dict[str, Any]:
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            timings[name] = timings.get(name, 0.0) + time.monotonic() - t0

    t_start = time.monotonic()
    pairs = task.prompts(settings.prompts_per_step, rng)
    gen = timed(
        "generate",
        client.generate,
        [p for p, _ in pairs],
        {
            "n": settings.samples_per_prompt,
            "max_tokens": settings.max_tokens,
            "temperature": 1.0,
            "seed": settings.seed * 100003 + step,
        },
    )
    outputs = gen["outputs"]
    rewards = [
        task.reward(c["text"], target)
        for (_, target), out in zip(pairs, outputs, strict=True)
        for c in out["completions"]
    ]
    advantages = group_advantages(rewards, settings.samples_per_prompt)
    rows, masks, plens = _rows(outputs)
    old = timed(
        "log_probs",
        client.log_probs,
        [r[:p] for r, p in zip(rows, plens, strict=True)],
        [r[p:] for r, p in zip(rows, plens, strict=True)],
    )
    old_rows = [
        [0.0] * p + list(o["log_probs"]) for o, p in zip(old["outputs"], plens, strict=True)
    ]
    batch: dict[str, Any] = {
        "input_ids": rows,
        "loss_mask": masks,
        "advantages": advantages,
        "old_log_probs": old_rows,
    }
    loss_config: dict[str, Any] = {}
    if settings.kl_coef > 0:
        batch["ref_log_probs"] = timed(
            "ref_log_probs", client.fwd_no_grad, {"input_ids": rows}, reference_model=True
        )
        loss_config["kl_coef"] = settings.kl_coef
    loss_config["kl_estimator"] = "k3"
    has_signal = any(a != 0 for a in advantages)
    metrics: dict[str, Any] = {"loss": 0.0}
    if has_signal:
        metrics = timed("fwd_bwd", client.fwd_bwd, batch, "grpo", loss_config)
    stepped = timed("step", client.step)
    timed("sync_weights", client.sync_weights)
    timings["total"] = time.monotonic() - t_start
    completion_tokens = sum(sum(m) for m in masks)
    return {
        "step": step,
        "reward_mean": sum(rewards) / len(rewards),
        "reward_max": max(rewards),
        "exact_fraction": sum(r >= 0.999 for r in rewards) / len(rewards),
        "loss": float(metrics.get("loss", 0.0)),
        "kl": float(metrics.get("kl", 0.0) or 0.0),
        "clip_fraction": float(metrics.get("clip_fraction", 0.0) or 0.0),
        "grad_norm": stepped.get("grad_norm"),
        "lr": stepped.get("lr"),
        "completion_tokens": completion_tokens,
        "weight_version": gen["weight_version"],
        "sample": outputs[0]["completions"][0]["text"],
        "seconds": timings,
    }


def _summarize(history: list[dict[str, Any]], setup: float, total: float) -> dict[str, Any]:
    rewards = [h["reward_mean"] for h in history]
    k = min(5, len(rewards))
    phases: dict[str, float] = {}
    for h in history:
        for name, sec in h["seconds"].items():
            phases[name] = phases.get(name, 0.0) + sec
    n = max(1, len(history))
    return {
        "steps": len(history),
        "first5_reward": sum(rewards[:k]) / k if k else 0.0,
        "last5_reward": sum(rewards[-k:]) / k if k else 0.0,
        "best_reward": max(rewards) if rewards else 0.0,
        "last_exact_fraction": history[-1]["exact_fraction"] if history else 0.0,
        "setup_seconds": setup,
        "total_seconds": total,
        "mean_step_seconds_by_phase": {name: sec / n for name, sec in phases.items()},
    }


def _summary_table(summary: dict[str, Any]) -> str:
    lines = [
        "| metric | value |",
        "|---|---|",
        f"| steps | {summary['steps']} |",
        f"| mean reward, first 5 steps | {summary['first5_reward']:.3f} |",
        f"| mean reward, last 5 steps | {summary['last5_reward']:.3f} |",
        f"| best step mean reward | {summary['best_reward']:.3f} |",
        f"| exact answers in the last step | {summary['last_exact_fraction']:.2%} |",
        f"| set-up (server, Ray, engines) | {summary['setup_seconds']:.1f} s |",
        f"| total | {summary['total_seconds']:.1f} s |",
    ]
    for name, sec in summary["mean_step_seconds_by_phase"].items():
        lines.append(f"| step time: {name} | {sec:.3f} s |")
    return "\n".join(lines) + "\n"


def _plot(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["reward_mean"] for h in history], label="mean reward")
    ax.plot(steps, [h["exact_fraction"] for h in history], label="exact answers", alpha=0.6)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title("Arctic RL demo: digit-sum task, tiny model, CPU")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
