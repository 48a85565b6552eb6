"""Reference log-probs from a plain transformers forward, and their distance to an engine's."""

from __future__ import annotations

from typing import Any


def reference_log_probs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion_j | prompt, completion_<j) from one transformers forward (float64)."""
    import torch

    ids = prompt + completion
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    table = torch.log_softmax(logits, dim=-1)
    return [float(table[len(prompt) + j - 1, t]) for j, t in enumerate(completion)]


def random_peft_model(model_path: str, rank: int, alpha: float, targets: Any, seed: int) -> Any:
    """A peft LoRA model (dropout 0) on the checkpoint at ``model_path`` whose ``lora_B`` are
    drawn from ``seed`` (peft starts them at zero: the adapter would change nothing)."""
    import peft
    import torch
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none"
    )
    model = peft.get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return model


def max_diff(a: list[float], b: list[float]) -> float:
    """The largest absolute difference of two equally long lists (0.0 for empty ones)."""
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
