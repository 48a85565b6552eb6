"""A Tinker model's LoRA settings: Tinker's ``LoraConfig`` as ``training_config.lora``, and the
checks (rank, targets, base model) made before any job starts.

Tinker trains LoRA only: its config names a rank, a seed and three switches (attention, MLP,
unembedding), which map onto module-name suffixes. The alpha is ours (Tinker does not publish
one; the cookbook's learning-rate helper assumes 32, the core default).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import LORA_RANKS, InvalidRequestError, LoraConfig

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
BASE_ADAPTER = "base"
"""The adapter name a LoRA sampling job serves the base model under (no adapter at all)."""
TINKER_DEFAULT_RANK = 32
"""The rank a ``create_model`` without ``lora_config`` gets (Tinker's default)."""


def target_modules(*, train_attn: bool, train_mlp: bool, train_unembed: bool) -> list[str]:
    """The module suffixes Tinker's three switches select (InvalidRequestError if none is on)."""
    targets = [
        *(ATTENTION_MODULES if train_attn else ()),
        *(MLP_MODULES if train_mlp else ()),
        *(UNEMBED_MODULES if train_unembed else ()),
    ]
    if not targets:
        raise InvalidRequestError(
            "lora_config trains nothing: at least one of train_attn, train_mlp and "
            "train_unembed must be true"
        )
    return targets


def lora_section(tinker_lora: dict[str, Any] | None) -> dict[str, Any]:
    """``training_config.lora`` for a Tinker ``LoraConfig`` (a dict of its fields, or None
    for Tinker's defaults); InvalidRequestError names what is wrong."""
    given = dict(tinker_lora or {})
    rank = given.get("rank", TINKER_DEFAULT_RANK)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidRequestError(f"lora_config.rank must be a positive integer, got {rank!r}")
    if rank > LORA_RANKS[-1]:
        raise InvalidRequestError(
            f"lora_config.rank {rank} is above {LORA_RANKS[-1]}, the largest rank the sampler "
            "(vLLM) serves; use a rank of at most that"
        )
    targets = target_modules(
        train_attn=bool(given.get("train_attn", True)),
        train_mlp=bool(given.get("train_mlp", True)),
        train_unembed=bool(given.get("train_unembed", True)),
    )
    try:
        lora = LoraConfig(rank=rank, target_modules=targets, seed=given.get("seed"))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequestError(f"invalid lora_config: {exc}") from None
    return lora.model_dump()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_local(name: str) -> bool:
    """A path rather than a hub id ``org/name`` (absolute, relative with a dot, or home)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def check_base_model(name: str) -> None:
    """Refuse a base model no job could load: a local path that does not exist, or (with
    ``HF_HUB_OFFLINE`` set) a hub id whose config is not in the local cache."""
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise InvalidRequestError(
                f"base_model {name!r} is a directory without config.json (not a model)"
            )
        return
    if _looks_local(name):
        raise InvalidRequestError(f"base_model {name!r}: no such file or directory")
    if not _hub_offline():
        return  # the jobs fetch it; a hub id that does not exist fails create_model's future
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if not isinstance(cached, str):
        raise InvalidRequestError(
            f"base_model {name!r} is neither a local path nor in the Hugging Face cache "
            "(HF_HUB_OFFLINE is set, so it cannot be downloaded)"
        )


def _module_names(model_dir: Path) -> set[str] | None:
    """The last name of every weight's module in a local model's safetensors headers (None
    when there are none to read), plus ``lm_head`` when the embeddings are tied."""
    names: set[str] = set()
    files = sorted(model_dir.glob("*.safetensors"))
    for file in files:
        with open(file, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size)) if 0 < size < 1 << 28 else {}
        names.update(k.rsplit(".", 2)[-2] for k in header if k.count(".") >= 1)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        names.add("lm_head")
    return names if files else None


def check_targets(base_model: str, targets: list[str]) -> None:
    """Refuse target modules a local base model does not have, naming those it has (a hub
    model is checked by its training job when it starts)."""
    path = Path(base_model).expanduser()
    if not path.is_dir():
        return
    try:
        names = _module_names(path)
    except (OSError, ValueError):
        return  # unreadable here: the training job's own check answers
    missing = [t for t in targets if names is not None and t not in names]
    if missing:
        raise InvalidRequestError(
            f"base_model {base_model!r} has no {missing} modules for LoRA (turn off the "
            f"train_* switch that needs them); its weights' modules: {sorted(names or ())}"
        )


__all__ = [
    "ATTENTION_MODULES",
    "BASE_ADAPTER",
    "MLP_MODULES",
    "TINKER_DEFAULT_RANK",
    "UNEMBED_MODULES",
    "check_base_model",
    "check_targets",
    "lora_section",
    "target_modules",
]
