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


def max_diff(a: list[float], b: list[float]) -> float:
    """The largest absolute difference of two equally long lists (0.0 for empty ones)."""
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
