"""LoRA adapter tensors on the wire: their names, and the shapes a receiver expects of them.

A LoRA weight sync moves only adapter tensors, under peft's export names with ``.default``
stripped: ``base_model.model.<module>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight``
(``[out, r]``) for every targeted linear layer of the base model. Core's own copy of the
name rule the engines use (core imports no plugin).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import InvalidRequestError

ADAPTER_PREFIX = "base_model.model."
"""What peft puts before a module's path in an exported adapter tensor's name."""
LORA_TENSOR = re.compile(r"\.lora_[AB]\.weight$")
BASE_ADAPTER = "base"
"""The reserved adapter name that serves the base model without any adapter."""


def is_lora_tensor(name: str) -> bool:
    """Whether ``name`` is an adapter tensor (``....lora_A.weight`` or ``....lora_B.weight``)."""
    return LORA_TENSOR.search(name) is not None


def lora_settings(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A job config's ``training_config.lora`` as a dict, or None: a job is in LoRA mode when
    its config has one (the same client config goes to every job of a run)."""
    training = config.get("training_config")
    lora = training.get("lora") if isinstance(training, Mapping) else None
    return dict(lora) if isinstance(lora, Mapping) else None


def targets(module: str, target_modules: Iterable[str]) -> bool:
    """Whether peft puts an adapter on ``module``: its path is a target or ends in
    ``.<target>`` (peft's rule for a list of names)."""
    return any(module == t or module.endswith("." + t) for t in target_modules)


def _tied_lm_head(model_dir: Path, base: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The lm_head's shape when the checkpoint ties it to the input embedding (no tensor of
    its own), else None."""
    config = model_dir / "config.json"
    try:
        tied = bool(json.loads(config.read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return None
    embedding = base.get("model.embed_tokens.weight")
    if not tied or "lm_head.weight" in base or embedding is None:
        return None
    return tuple(embedding[0])


def expected_adapter(
    base: Mapping[str, tuple[tuple[int, ...], str | None]],
    rank: int,
    target_modules: Iterable[str],
    model_dir: str | Path | None = None,
) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """The adapter tensors (name -> (shape, any dtype)) of a rank-``rank`` LoRA on every
    targeted linear layer of a base model whose checkpoint has the tensors ``base``
    (``buckets.expected_from_checkpoint``); ``model_dir`` resolves a tied lm_head."""
    wanted = list(target_modules)
    linears = {
        name.removesuffix(".weight"): tuple(shape)
        for name, (shape, _) in base.items()
        if name.endswith(".weight") and len(shape) == 2 and "embed" not in name
    }
    if model_dir is not None and "lm_head" not in linears:
        tied = _tied_lm_head(Path(model_dir), base)
        if tied is not None:
            linears["lm_head"] = tied
    out: dict[str, tuple[tuple[int, ...], str | None]] = {}
    for module, (rows, cols) in sorted(linears.items()):
        if targets(module, wanted):
            out[f"{ADAPTER_PREFIX}{module}.lora_A.weight"] = ((rank, cols), None)
            out[f"{ADAPTER_PREFIX}{module}.lora_B.weight"] = ((rows, rank), None)
    if not out:
        raise InvalidRequestError(
            f"LoRA target_modules {wanted} match no linear layer of the receiver's model"
        )
    return out


def adapter_bytes(expected: Mapping[str, tuple[tuple[int, ...], Any]], element_size: int) -> int:
    """Bytes of the adapter tensors ``expected`` at ``element_size`` bytes an element."""
    total = 0
    for shape, _ in expected.values():
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * element_size
    return total


__all__ = [
    "ADAPTER_PREFIX",
    "BASE_ADAPTER",
    "LORA_TENSOR",
    "adapter_bytes",
    "expected_adapter",
    "is_lora_tensor",
    "lora_settings",
    "targets",
]
