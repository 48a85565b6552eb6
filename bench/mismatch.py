"""Sampler/trainer mismatch for each pair of engine and dtype this machine runs (issue 34).

Each sampler (our vLLM engine: float32, bfloat16, bfloat16 with a float32 head through vLLM's
``hf_overrides={"head_dtype": "float32"}``) samples the same prompts (temperature 1, seeded);
each trainer (our DeepSpeed training engine: float32, bfloat16, bfloat16 with
``fp32_lm_head``) scores every sampler's rows with a forward-only ``fwd_bwd`` whose batch
carries the sampler's ``rollout_log_probs``, so the figures are the engine's own mismatch
metrics: k3 (KL(sampler||trainer), unbiased, >= 0), k1, and the largest token log-prob gap
(from the ratio's min and max). The model is the tiny one with its output projection scaled
so its logits spread like a trained LM's (``sharpened``; float32 on disk); the ratio column is
each pair's k3 over the all-float32 pair's.

LoRA pairs (``--lora RANK``, default 16): one adapter (peft's default targets of
``LoraConfig``, lm_head included; ``lora_B`` drawn at random, since peft starts it at zero and
an untrained adapter would change nothing) is loaded into vLLM's LoRA path of each sampler
(float32, bfloat16) and copied into the LoRA parameters of each trainer, so sampler and
trainer hold the same adapter and differ only in engines and dtypes.
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
LORA_SAMPLERS = ("vLLM fp32", "vLLM bf16")
BASELINE = ("vLLM fp32", "DeepSpeed fp32")


def _prompts(count: int) -> list[str]:
    words = "the sum of digits is one two three answer number write give".split()
    return [f"{i} + {i * 7 % 100} = " + " ".join(words[: 3 + i % 8]) for i in range(count)]


def _sample(
    model: str,
    vllm_config: dict[str, Any],
    prompts: list[str],
    n: int,
    tokens: int,
    adapter: tuple[Any, dict[str, Any]] | None = None,
):
    """The rows one sampler draws: ``input_ids``, ``loss_mask`` and ``rollout_log_probs``;
    with ``adapter`` (its ``LoraConfig`` and tensors) served through vLLM's LoRA path."""
    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    training = TrainingConfig(lora=adapter[0]) if adapter else TrainingConfig()
    config = ArcticRLClientConfig(
        model_name=model,
        sampling_gpus=1,
        host="127.0.0.1",
        seed=0,
        vllm_config=vllm_config,
        training_config=training,
    )
    engine = VLLMSamplingEngine(config)
    try:
        if adapter:
            from arctic_platform.rl.api import DEFAULT_ADAPTER

            engine.load_adapter(DEFAULT_ADAPTER, 1, adapter[1].items())
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


def _score(
    model: str,
    training: dict[str, Any],
    batches: dict[str, dict],
    adapter: tuple[Any, dict[str, Any]] | None = None,
) -> dict[str, dict]:
    """One trainer's mismatch metrics against every sampler's rows (with ``adapter`` copied
    into its LoRA parameters)."""
    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry

    if adapter:
        training = {**training, "lora": adapter[0]}
    config = ArcticRLClientConfig(
        model_name=model, training_gpus=1, training_config=TrainingConfig(**training)
    )
    engine = (
        get_registry()
        .get("engine", "deepspeed", role="training")
        .create(config, EngineContext(role="training"))
    )
    try:
        if adapter:
            _copy_adapter(engine, adapter[1])
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


def _alone(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a fresh interpreter: vLLM's and DeepSpeed's process-wide
    distributed state do not survive each other's engines in one process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def _copy_adapter(engine: Any, tensors: dict[str, Any]) -> None:
    """Copy an exported adapter into a DeepSpeed training engine's LoRA parameters (cast to
    their dtype), checked to be exactly the adapter's tensors."""
    import torch

    from arctic_rl_engines import ds_lora

    module = engine._engine.module
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, tensor in ds_lora.checked_adapter(module, tensors.items()):
            params[name].copy_(tensor)


def random_adapter(model: str, rank: int, seed: int = 0, scale: float = 0.05):
    """A ``LoraConfig`` of ``rank`` (default targets) and an adapter for it under peft's
    export names, ``lora_B`` drawn at ``scale`` (peft starts it at zero)."""
    import peft
    import torch
    import transformers

    from arctic_platform.rl.config import LoraConfig

    lora = LoraConfig(rank=rank, alpha=2.0 * rank)
    base = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    wrapped = peft.get_peft_model(
        base,
        peft.LoraConfig(
            r=rank,
            lora_alpha=lora.alpha,
            target_modules=list(lora.target_modules),
            lora_dropout=0.0,
            bias="none",
        ),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(scale * torch.randn(param.shape, generator=generator))
    state = peft.get_peft_model_state_dict(wrapped, save_embedding_layers=False)
    return lora, {name: t.detach().clone() for name, t in state.items()}


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
    lora_rank: int = 16,
) -> dict:
    """Every sampler x trainer pair's k3, k1 and largest gap, with full weights and (when
    ``lora_rank`` > 0) a LoRA adapter; ratio: k3 over the all-fp32 full-weight pair's.
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
    batches = {
        name: _alone(_sample, model, cfg, texts, n, max_tokens) for name, cfg in SAMPLERS.items()
    }
    pairs: dict[str, dict[str, dict]] = {}
    for name, training in TRAINERS.items():
        pairs[name] = _alone(_score, model, training, batches)
    if lora_rank > 0:
        adapter = random_adapter(model, lora_rank)
        lora_batches = {
            f"{name} LoRA": _alone(_sample, model, SAMPLERS[name], texts, n, max_tokens, adapter)
            for name in LORA_SAMPLERS
        }
        for name, training in TRAINERS.items():
            pairs[f"{name} LoRA"] = _alone(_score, model, training, lora_batches, adapter)
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
            "lora_rank": lora_rank,
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
    """The README's tables: one row per trainer, one column per sampler, k3 (max gap); the
    LoRA pairs in a second table."""
    out = []
    for lora in (False, True):
        trainers = {t: s for t, s in report["pairs"].items() if t.endswith(" LoRA") == lora}
        if not trainers:
            continue
        samplers = list(next(iter(trainers.values())))
        lines = ["| trainer \\ sampler | " + " | ".join(samplers) + " |"]
        lines.append("|---" * (len(samplers) + 1) + "|")
        for trainer, by_sampler in trainers.items():
            cells = [
                f"{by_sampler[s]['k3']:.1e} ({by_sampler[s]['max_abs_gap']:.1e})" for s in samplers
            ]
            lines.append(f"| {trainer} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--logit-std", type=float, default=5.0)
    parser.add_argument(
        "--lora", dest="lora_rank", type=int, default=16, help="adapter rank (0: no LoRA pairs)"
    )
    result = run(**vars(parser.parse_args()))
    print(json.dumps(result, indent=2))
    print(table(result))
