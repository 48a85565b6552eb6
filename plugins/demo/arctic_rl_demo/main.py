"""``arctic-rl demo``: SFT warm start then GRPO on the digit-reversal task, on this machine's CPU.

Builds the tiny model, starts the local backend (logical GPUs in CPU mode) and, through the
public ``AsyncArcticRLClient`` only: a supervised warm start (``fwd_bwd`` with
``cross_entropy`` on demonstrations, checkpoint saved), then GRPO on the exact-match reward
(generate → rewards → group advantages → ``fwd_bwd(loss_fn="grpo")`` with the sampler's
behaviour log-probs → ``step`` → ``sync_weights``). A fixed held-out set is scored by greedy
exact match before and after the warm start and every ``eval_every`` RL steps. With
``async_mode`` rollouts for later steps are generated while a step trains (``async_loop``).
Writes ``metrics.jsonl``, ``reward.png``, ``summary.md`` and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from arctic_rl_demo.async_loop import rl_async
from arctic_rl_demo.report import plot, summarize, summary_table
from arctic_rl_demo.run import MODEL_SIZES, DemoRun, DemoSettings

LOOPBACK = "127.0.0.1"


def run_demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the demo end to end; returns the summary (also written as ``summary.json``)."""
    return asyncio.run(_run(settings))


def _config(settings: DemoSettings, model: Path) -> Any:
    from arctic_platform.rl.api import ArcticRLClientConfig, free_port, get_registry

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
            **({"lora": {"rank": settings.lora_rank}} if settings.lora_rank else {}),
        },
    )


async def _run(settings: DemoSettings) -> dict[str, Any]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from arctic_platform.rl import AsyncArcticRLClient
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
        run.run_log.close()
        await client.shutdown()
    seconds["total"] = time.monotonic() - started
    summary = summarize(run, before, after_sft, final, seconds)
    plot(run.records, s, out_dir / "reward.png")
    (out_dir / "summary.md").write_text(summary_table(summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not s.quiet:
        print(summary_table(summary))
    return summary
