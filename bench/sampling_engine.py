"""Sampling throughput: our ``vllm`` sampling engine vs calling ``vllm.LLM`` directly.

Both engines live in one process with the same engine arguments and get the same prompts and
sampling parameters (32 prompts x n=4 x 32 tokens by default, ``ignore_eos`` so every
completion has the same length, the sampled-token log-probs that our engine always returns).
Both are warmed up, then timed in alternating order; reports generated tokens/s and the
ratio ours / direct (the median over back-to-back pairs; goal >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from bench.timing import Side, paired


def _prompts(count: int) -> list[str]:
    words = "the sum of digits is one two three answer number write give".split()
    return [f"{i} + {i * 7 % 100} = " + " ".join(words[: 3 + i % 8]) for i in range(count)]


def run(
    prompts: int = 32,
    n: int = 4,
    max_tokens: int = 32,
    repeats: int = 9,
    model: str | None = None,
) -> dict[str, Any]:
    """Time both engines on the same workload; returns tokens/s of each and their ratio."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="arctic-rl-bench-") as tmp:
        if model is None:
            from arctic_platform.rl.testing import build_tiny_model

            model = str(build_tiny_model(os.path.join(tmp, "tiny-llama")))
        return _run(model, prompts, n, max_tokens, repeats)


def _our_tokens(out: list[dict[str, Any]]) -> dict[str, float]:
    return {"tokens": sum(len(c["token_ids"]) for r in out for c in r["completions"])}


def _direct_tokens(out: list[Any]) -> dict[str, float]:
    return {"tokens": sum(len(c.token_ids) for r in out for c in r.outputs)}


def _run(model: str, prompts: int, n: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    import torch

    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    config = ArcticRLClientConfig(
        model_name=model, sampling_gpus=1, host="127.0.0.1", port=7000, seed=0
    )
    texts = _prompts(prompts)
    params: dict[str, Any] = {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
    }

    ours = VLLMSamplingEngine(config)
    from vllm import LLM, SamplingParams

    direct_kwargs = {k: v for k, v in ours.engine_kwargs.items() if k != "worker_extension_cls"}
    started = time.monotonic()
    direct = LLM(**direct_kwargs)
    direct_start = time.monotonic() - started
    direct_params = SamplingParams(**params, logprobs=0)

    try:
        timing = paired(
            {
                "ours": Side(lambda: ours.generate(texts, params), measure=_our_tokens),
                "direct": Side(
                    lambda: direct.generate(texts, direct_params, use_tqdm=False),
                    measure=_direct_tokens,
                ),
            },
            repeats,
            warmup=2,  # the first calls are slow
        )
    finally:
        ours.close()
        direct.llm_engine.engine_core.shutdown()
    # tokens per second of wall time and per CPU-second of this process, call by call
    tps = {side: timing.per(side, "tokens") for side in timing.sides}
    per_cpu = {side: timing.per(side, "tokens", "cpu") for side in timing.sides}
    ours_median = statistics.median(tps["ours"])
    direct_median = statistics.median(tps["direct"])
    # Each repeat times both back to back: the ratio within a pair cancels slow drifts in
    # machine load, so its median is the headline number.
    pair_ratios = [a / b for a, b in zip(tps["ours"], tps["direct"], strict=True)]
    return {
        "workload": {"prompts": prompts, "n": n, "max_tokens": max_tokens, "repeats": repeats},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "in_process": ours.in_process,
        "start_seconds": {"ours": ours.start_seconds, "direct": direct_start},
        "tokens_per_second": {"ours": ours_median, "direct": direct_median},
        "samples": tps,
        "pair_ratios": pair_ratios,
        # Tokens per CPU-second of this process: insensitive to other processes on the machine.
        "tokens_per_cpu_second": {side: statistics.median(v) for side, v in per_cpu.items()},
        "cpu_ratio": statistics.median(per_cpu["ours"]) / statistics.median(per_cpu["direct"]),
        "ratio_of_medians": ours_median / direct_median,
        "ratio": statistics.median(pair_ratios),
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    tps = report["tokens_per_second"]
    w = report["workload"]
    shape = f"{w['prompts']}x{w['n']}x{w['max_tokens']}"
    return [
        (f"sampling: vllm.LLM direct, {shape} (baseline)", f"{tps['direct']:.0f} tok/s", "1.00"),
        (
            f"sampling: arctic-rl vllm engine, {shape}",
            f"{tps['ours']:.0f} tok/s",
            f"{report['ratio']:.3f}",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--model", default=None, help="model path (default: a tiny local model)")
    args = parser.parse_args()
    result = run(args.prompts, args.n, args.max_tokens, args.repeats, args.model)
    print(json.dumps(result, indent=2))
    print(
        f"ratio ours/direct tokens/s: {result['ratio']:.3f} "
        f"(per CPU-second: {result['cpu_ratio']:.3f})"
    )
