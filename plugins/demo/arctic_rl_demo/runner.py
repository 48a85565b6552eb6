"""The demo's one loop, for every task: build the tiny model, start the local backend through
the public ``AsyncArcticRLClient``, score the held-out set, warm start, GRPO, score again,
then the report (``summary.json``, ``summary.md``, ``reward.png``; ``metrics.jsonl`` and the
trackers are written as the run goes).

A task is a ``DemoTask``: its settings, how to make its run (the phases: ``evaluate``,
``warm_start``, ``rl``, ``aclose``; ``task_run.TaskRun`` is their common base) and its report.
Each lives in its own folder under ``tasks`` (``reverse``: digit reversal; ``lookup``: the
tool-calling agent), which exposes it as ``TASK``; ``tasks.TASKS`` names them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
}


@dataclass(frozen=True)
class DemoTask:
    """What the loop needs of one task.

    ``settings`` is its settings class (a ``LoopSettings``: ``from_flags`` reads the command's
    flags, ``warm_steps`` counts the warm start); ``make_run(settings, client, tokenizer,
    out_dir)`` returns the run, whose coroutines ``evaluate(rl_step)``, ``warm_start(bar)``,
    ``rl(bar)`` and ``aclose()`` are the phases; ``report`` has ``summarize(run, before,
    after_sft, final, seconds)``, ``plot(records, settings, path)``, ``summary_table(summary)``
    and ``headline(summary, settings)`` (the command's one-line result).
    """

    name: str
    settings: type
    make_run: Callable[..., Any]
    report: Any
    rl_label: Callable[[Any], str]
    chat_format: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def run_task(task: DemoTask, settings: Any) -> dict[str, Any]:
    """Run ``task`` end to end; returns its summary (also written as ``summary.json``)."""
    return asyncio.run(_run(task, settings))


def client_config(settings: Any, model: Path) -> Any:
    """The client config of a demo run: one training and one sampling GPU (logical on CPU),
    loopback and a free port for a transport on host:port, LoRA when the settings ask."""
    from arctic_platform.rl.api import ArcticRLClientConfig, free_port, get_registry

    network = get_registry().get("transport", settings.transport).network_address
    lora_rank = getattr(settings, "lora_rank", None)
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
            **({"lora": {"rank": lora_rank}} if lora_rank else {}),
        },
    )


def _build_model(task: DemoTask, settings: Any, out_dir: Path) -> Path:
    from arctic_platform.rl.testing import build_tiny_model

    size = MODEL_SIZES[settings.model_size]
    suffix = f"-{task.chat_format}" if task.chat_format else ""
    return build_tiny_model(
        out_dir / f"model-{settings.model_size}{suffix}",
        hidden_size=size["hidden_size"],
        num_layers=size["num_layers"],
        num_heads=size["num_heads"],
        seed=settings.seed,
        **({"chat_format": task.chat_format} if task.chat_format else {}),
    )


async def _run(task: DemoTask, settings: Any) -> dict[str, Any]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from arctic_platform.rl import AsyncArcticRLClient

    s = settings
    out_dir = s.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ARCTIC_RL_HOME", str(out_dir / ".arctic_rl"))
    # vLLM's CPU auto-binding pins the sampler's OpenMP threads to cores it picks; one
    # unpinned thread per engine let generation and training overlap on a 2-core machine
    # (bench/async_pipeline.py measured it).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for key, value in task.env.items():
        os.environ.setdefault(key, value)
    model = _build_model(task, s, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    print(f"arctic-rl demo --task {task.name}: output in {out_dir}", file=sys.stderr)
    started = time.monotonic()
    client = await AsyncArcticRLClient.create(client_config(s, model), progress=not s.quiet)
    seconds: dict[str, float] = {"setup": time.monotonic() - started}
    run = task.make_run(s, client, tokenizer, out_dir)
    try:
        t0 = time.monotonic()
        before = await run.evaluate(-1)
        with tqdm(total=s.warm_steps, desc="SFT (demos)", file=sys.stderr, disable=s.quiet) as bar:
            await run.warm_start(bar)
        after_sft = await run.evaluate(0)
        run.last_eval = after_sft
        seconds["sft"] = time.monotonic() - t0
        t0 = time.monotonic()
        with tqdm(total=s.steps, desc=task.rl_label(s), file=sys.stderr, disable=s.quiet) as bar:
            await run.rl(bar)
        seconds["rl"] = time.monotonic() - t0
        final = await run.evaluate(s.steps)
    finally:
        await run.aclose()
        await client.shutdown()
    seconds["total"] = time.monotonic() - started
    report = task.report
    summary: dict[str, Any] = report.summarize(run, before, after_sft, final, seconds)
    report.plot(run.records, s, out_dir / "reward.png")
    (out_dir / "summary.md").write_text(report.summary_table(summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not s.quiet:
        print(report.summary_table(summary))
    return summary
