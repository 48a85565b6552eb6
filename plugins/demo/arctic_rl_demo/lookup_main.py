"""``arctic-rl demo --task lookup``: an agent that learns to use a tool, on this machine's CPU.

Builds the tiny ChatML (tool-calling) model, starts the local backend and, through the public
``AsyncArcticRLClient`` only: held-out success through the agent path, a supervised warm start
on rendered demonstrations, then GRPO whose rollouts are openai-agents runs in agent sessions
(``lookup_agent``) and whose batches are the sessions' trajectories (``lookup_grpo``).
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

from arctic_rl_demo.lookup_report import plot, summarize, summary_table
from arctic_rl_demo.lookup_run import LookupRun, LookupSettings
from arctic_rl_demo.run import MODEL_SIZES

LOOPBACK = "127.0.0.1"


def run_lookup_demo(settings: LookupSettings) -> dict[str, Any]:
    """Run the lookup demo end to end; returns the summary (also written as ``summary.json``)."""
    return asyncio.run(_run(settings))


def _config(settings: LookupSettings, model: Path) -> Any:
    from arctic_platform.rl.api import ArcticRLClientConfig, free_port

    return ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol=settings.transport,
        host=LOOPBACK,
        port=free_port(),
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


def _build_model(settings: LookupSettings, out_dir: Path) -> Path:
    from arctic_platform.rl.testing import build_tiny_model

    size = MODEL_SIZES[settings.model_size]
    return build_tiny_model(
        out_dir / f"model-{settings.model_size}-chatml",
        hidden_size=size["hidden_size"],
        num_layers=size["num_layers"],
        num_heads=size["num_heads"],
        seed=settings.seed,
        chat_format="chatml",
    )


async def _run(settings: LookupSettings) -> dict[str, Any]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from arctic_platform.rl import AsyncArcticRLClient

    s = settings
    out_dir = s.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ARCTIC_RL_HOME", str(out_dir / ".arctic_rl"))
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = _build_model(s, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    print(f"arctic-rl demo --task lookup: output in {out_dir}", file=sys.stderr)
    started = time.monotonic()
    client = await AsyncArcticRLClient.create(_config(s, model), progress=not s.quiet)
    seconds: dict[str, float] = {"setup": time.monotonic() - started}
    run = LookupRun(s, client, tokenizer, out_dir)
    try:
        t0 = time.monotonic()
        before = await run.evaluate(-1)
        sft_total = s.sft_short_steps + s.sft_steps
        with tqdm(total=sft_total, desc="SFT (demos)", file=sys.stderr, disable=s.quiet) as bar:
            await run.warm_start(bar)
        after_sft = await run.evaluate(0)
        run.last_eval = after_sft
        seconds["sft"] = time.monotonic() - t0
        t0 = time.monotonic()
        with tqdm(total=s.steps, desc="GRPO (agent)", file=sys.stderr, disable=s.quiet) as bar:
            await run.rl(bar)
        final = await run.evaluate(s.steps)
        seconds["rl"] = time.monotonic() - t0
    finally:
        await run.aclose()
        await client.shutdown()
    seconds["total"] = time.monotonic() - started
    summary = summarize(run, before, after_sft, final, seconds)
    plot(run.records, s, out_dir / "reward.png")
    (out_dir / "summary.md").write_text(summary_table(summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not s.quiet:
        print(summary_table(summary))
    return summary
