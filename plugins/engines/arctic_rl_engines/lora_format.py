"""The on-disk PEFT adapter format both LoRA sides write: ``adapter_config.json``'s contents.

The training engine (checkpoints) and the sampling engine (adapters loaded into vLLM) build
the same dict here, so alpha, rank and targets can never differ between the two files.
"""

from __future__ import annotations

from typing import Any

from arctic_platform.rl.api import InvalidRequestError, LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_config_dict(
    lora: LoraConfig, rank: int, *, base_model: str | None = None
) -> dict[str, Any]:
    """``adapter_config.json`` of a plain LoRA (no bias, rsLoRA or DoRA) that peft and vLLM load.

    ``rank`` is the rank of the tensors written (``lora.rank``, or a larger rank they were
    zero-padded to); alpha is scaled with it so the update stays ``lora.alpha / lora.rank``.
    """
    if rank < lora.rank:
        raise InvalidRequestError(f"rank {rank} is below the adapter's rank {lora.rank}")
    alpha = lora.alpha * rank / lora.rank
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": int(alpha) if float(alpha).is_integer() else float(alpha),
        "target_modules": sorted(lora.target_modules),
        "lora_dropout": float(lora.dropout),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
