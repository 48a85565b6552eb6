"""Training step time: our ``deepspeed`` engine vs a bare DeepSpeed loop, same model and batch.

Ours is ``fwd_bwd(batch, "ppo")`` + ``step()`` on the ragged list batch, as a job's worker
calls it (validation, padding, metrics included). The baseline is the loop one writes by
hand: tensors built once up front, forward, the same clipped-ratio token-mean loss,
``engine.backward``, ``engine.step``. Rounds alternate between the two; the report is the
median step time of each and their ratio (goal <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.timing import paired


def make_batch(rows: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> dict:
    """Ragged rows: an 8-token prompt (not trained), completion trained, ±1 advantages."""
    rng = random.Random(seed)
    ids = [
        [rng.randrange(10, vocab) for _ in range(rng.randint(min_len, max_len))]
        for _ in range(rows)
    ]
    return {
        "input_ids": ids,
        "loss_mask": [[0.0] * 8 + [1.0] * (len(r) - 8) for r in ids],
        "advantages": [1.0 if i % 2 == 0 else -1.0 for i in range(rows)],
        "old_log_probs": [[0.0] + [-6.0] * (len(r) - 1) for r in ids],
    }


def _bare_engine(model_path: str, ds_config: dict[str, Any], lr: float) -> Any:
    import deepspeed
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    return engine


def _bare_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    import torch

    width = max(len(r) for r in batch["input_ids"])

    def pad(rows: list[list[float]], dtype: Any) -> Any:
        out = torch.zeros((len(rows), width), dtype=dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
        return out

    adv = [[a] * len(r) for a, r in zip(batch["advantages"], batch["input_ids"], strict=True)]
    return {
        "input_ids": pad(batch["input_ids"], torch.long),
        "mask": pad(batch["loss_mask"], torch.float32),
        "adv": pad(adv, torch.float32),
        "old": pad(batch["old_log_probs"], torch.float32),
    }


def _bare_step(engine: Any, t: dict[str, Any], eps: float = 0.2) -> float:
    import torch

    ids = t["input_ids"]
    logits = engine(input_ids=ids, use_cache=False).logits[:, :-1].float()
    logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    mask, adv, old = t["mask"][:, 1:], t["adv"][:, 1:], t["old"][:, 1:]
    ratio = torch.exp((logp - old).clamp(-20, 20) * (mask > 0))
    loss_tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps))
    loss = (loss_tok * mask).sum() / mask.sum()
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def run(
    steps: int = 6,
    rounds: int = 4,
    rows: int = 16,
    min_len: int = 64,
    max_len: int = 192,
    stage: int = 0,
    hidden_size: int = 256,
    num_layers: int = 4,
) -> dict[str, Any]:
    """Time both loops (``rounds`` x ``steps`` each, alternating); returns times and ratio."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry
    from arctic_platform.rl.testing import build_tiny_model

    cache = Path(tempfile.gettempdir()) / "arctic_rl_bench_models"
    model_path = str(
        build_tiny_model(
            cache / f"llama-h{hidden_size}-l{num_layers}",
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=max(1, hidden_size // 64),
        )
    )
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    lr = 1e-5
    config = ArcticRLClientConfig(
        model_name=model_path,
        training_gpus=1,
        ds_config={"zero_optimization": zero},
        training_config=TrainingConfig(optimizer={"lr": lr, "gradient_clipping": 1.0}),
    )
    ours = (
        get_registry()
        .get("engine", "deepspeed", role="training")
        .create(config, EngineContext(role="training"))
    )
    bare_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
    }
    bare = _bare_engine(model_path, bare_config, lr)
    vocab = int(bare.module.config.vocab_size)
    params = sum(t.numel() for _, t in ours.named_weights())
    batch = make_batch(rows, min_len, max_len, vocab)
    tensors = _bare_tensors(batch)

    def ours_step() -> None:
        ours.fwd_bwd(batch, "ppo")
        ours.step()

    def bare_step() -> None:
        _bare_step(bare, tensors)

    # warm-up (allocator, first-call paths): 2 steps a side; then ``steps`` steps a side a round
    timing = paired({"ours": ours_step, "bare": bare_step}, rounds, warmup=2, calls=steps)
    ours.close()
    bare.destroy()
    ours_s, bare_s = timing.median("ours"), timing.median("bare")
    return {
        "benchmark": "training_engine",
        "zero_stage": stage,
        "params": params,
        "batch_rows": rows,
        "batch_tokens": sum(len(r) for r in batch["input_ids"]),
        "threads": torch.get_num_threads(),
        "steps_timed": len(timing.samples("ours")),
        "ours_step_s": ours_s,
        "bare_step_s": bare_s,
        "ratio": ours_s / bare_s,
        "paired_ratio": timing.ratio("ours", "bare"),  # median of the rounds' ratios
        "goal": 1.05,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    return [
        (
            f"training step (fwd_bwd+step, ZeRO-{report['zero_stage']}) vs bare DeepSpeed",
            f"{report['ours_step_s'] * 1000:.1f} ms vs {report['bare_step_s'] * 1000:.1f} ms",
            f"{report['ratio']:.3f}",
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--stage", type=int, default=0, choices=(0, 1, 2, 3))
    args = parser.parse_args()
    result = run(steps=args.steps, rounds=args.rounds, rows=args.rows, stage=args.stage)
    print(json.dumps(result, indent=2))
    print(f"training step: ours / bare DeepSpeed = {result['ratio']:.3f} (goal <= 1.05)")
