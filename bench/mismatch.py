"""Sampler/trainer mismatch for each pair of engine and dtype this machine runs (issue 34).

Each sampler (our vLLM engine: float32, bfloat16, bfloat16 with a float32 head through vLLM's
``hf_overrides={"head_dtype": "float32"}``) samples the same prompts (temperature 1, seeded);
each trainer (our DeepSpeed training engine: float32, bfloat16, bfloat16 with
``fp32_lm_head``) scores every sampler's rows with a forward-only ``fwd_bwd`` whose batch
carries the sampler's ``rollout_log_probs``, so the figures are the engine's own mismatch
metrics: k3 (KL(sampler||trainer), unbiased, >= 0), k1, and the largest token log-prob gap
(from the ratio's min and max). The model is the tiny one with its output projection scaled
so its logits spread like a trained LM's (``sharpened``; float32 on disk); the ratio column is
each pair's k3 over the all-float32 pair's. Full weights here; LoRA pairs are not measured yet.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

SAMPLERS: dict[str, dict[str, Any]] = {
    "vLLM fp32": {"dtype": "float32"},
    "vLLM bf16": {"dtype": "bfloat16"},
    "vLLM bf16 + fp32 head": {"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"}},
}
TRAINERS: dict[str, dict[str, Any]] = {
    "DeepSpeed fp32": {"dtype": "float32"},
    "DeepSpeed bf16": {"dtype": "bfloat16"},
    "DeepSpeed bf16 + fp32_lm_head": {"dtype": "bfloat16", "fp32_lm_head": True},
}
BASELINE = ("vLLM fp32", "DeepSpeed fp32")


def _prompts(count: int) -> list[str]:
    words = "the sum of digits is one two three answer number write give".split()
    return [f"{i} + {i * 7 % 100} = " + " ".join(words[: 3 + i % 8]) for i in range(count)]


def _sample(model: str, vllm_config: dict[str, Any], prompts: list[str], n: int, tokens: int):
    """The rows one sampler draws: ``input_ids``, ``loss_mask`` and ``rollout_log_probs``."""
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    config = ArcticRLClientConfig(
        model_name=model, sampling_gpus=1, host="127.0.0.1", seed=0, vllm_config=vllm_config
    )
    engine = VLLMSamplingEngine(config)
    try:
        params = {"n": n, "max_tokens": tokens, "temperature": 1.0, "seed": 1}
        outputs = engine.generate(prompts, params)
    finally:
        engine.close()
    batch: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "rollout_log_probs": []}
    for out in outputs:
        prompt = list(out["prompt_token_ids"])
        for c in out["completions"]:
            ids = list(c["token_ids"])
            batch["input_ids"].append(prompt + ids)
            batch["loss_mask"].append([0.0] * len(prompt) + [1.0] * len(ids))
            batch["rollout_log_probs"].append([0.0] * len(prompt) + list(c["logprobs"]))
    batch["advantages"] = [1.0] * len(batch["input_ids"])
    return batch


def _score(model: str, training: dict[str, Any], batches: dict[str, dict]) -> dict[str, dict]:
    """One trainer's mismatch metrics against every sampler's rows."""
    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry

    config = ArcticRLClientConfig(
        model_name=model, training_gpus=1, training_config=TrainingConfig(**training)
    )
    engine = (
        get_registry()
        .get("engine", "deepspeed", role="training")
        .create(config, EngineContext(role="training"))
    )
    try:
        out = {}
        for name, batch in batches.items():
            m = engine.fwd_bwd(batch, "grpo", forward_only=True)
            low, high = m["mismatch_ratio.min"], m["mismatch_ratio.max"]
            out[name] = {
                "k3": m["mismatch_k3"],
                "k1": m["mismatch_k1"],
                "max_abs_gap": max(abs(math.log(low)), abs(math.log(high))),
                "tokens": m["tokens"],
            }
        return out
    finally:
        engine.close()
        gc.collect()


def sharpened(source: str, target: Path, logit_std: float) -> str:
    """A copy of the model at ``source`` whose output projection is scaled so its logits
    spread like a trained LM's (standard deviation ``logit_std``; a random tiny model's are
    about 0.2, where rounding them to bf16 costs almost nothing)."""
    import shutil

    import torch
    import transformers

    if (target / "config.json").is_file():
        return str(target)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    ids = torch.arange(64).remainder(model.config.vocab_size).view(2, 32)
    with torch.no_grad():
        spread = float(model(input_ids=ids).logits.std())
        model.get_output_embeddings().weight.mul_(logit_std / spread)
    model.save_pretrained(target)
    for name in os.listdir(source):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(os.path.join(source, name), target / name)
    return str(target)


def run(
    prompts: int = 16,
    n: int = 4,
    max_tokens: int = 32,
    model: str | None = None,
    logit_std: float = 5.0,
) -> dict:
    """Every sampler x trainer pair's k3, k1 and largest gap; ratio: k3 over all-fp32's.
    Without ``model``: the tiny model with its logits spread to ``logit_std``."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if model is None:
        from arctic_platform.rl.testing import build_tiny_model

        cache = Path(tempfile.gettempdir()) / "arctic_rl_bench_models"
        base = str(build_tiny_model(cache / "llama-h128-l2"))
        model = sharpened(base, cache / f"llama-h128-l2-logits{logit_std:g}", logit_std)
    texts = _prompts(prompts)
    batches = {name: _sample(model, cfg, texts, n, max_tokens) for name, cfg in SAMPLERS.items()}
    pairs: dict[str, dict[str, dict]] = {}
    for name, training in TRAINERS.items():
        pairs[name] = _score(model, training, batches)
    base = pairs[BASELINE[1]][BASELINE[0]]["k3"]
    for trainer in pairs.values():
        for figures in trainer.values():
            figures["ratio"] = figures["k3"] / base if base > 0 else math.inf
    return {
        "benchmark": "mismatch",
        "workload": {
            "prompts": prompts,
            "n": n,
            "max_tokens": max_tokens,
            "logit_std": logit_std,
        },
        "pairs": pairs,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio) for every trainer x sampler pair."""
    out = []
    for trainer, samplers in report["pairs"].items():
        for sampler, f in samplers.items():
            out.append(
                (
                    f"mismatch: {sampler} sampler vs {trainer} trainer",
                    f"k3 {f['k3']:.2e}, max gap {f['max_abs_gap']:.2e} nats",
                    f"{f['ratio']:.3g}",
                )
            )
    return out


def table(report: dict[str, Any]) -> str:
    """The README's table: one row per trainer, one column per sampler, k3 (max gap)."""
    samplers = list(next(iter(report["pairs"].values())))
    lines = ["| trainer \\ sampler | " + " | ".join(samplers) + " |"]
    lines.append("|---" * (len(samplers) + 1) + "|")
    for trainer, by_sampler in report["pairs"].items():
        cells = [
            f"{by_sampler[s]['k3']:.1e} ({by_sampler[s]['max_abs_gap']:.1e})" for s in samplers
        ]
        lines.append(f"| {trainer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--logit-std", type=float, default=5.0)
    args = parser.parse_args()
    result = run(
        prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, logit_std=args.logit_std
    )
    print(json.dumps(result, indent=2))
    print(table(result))
