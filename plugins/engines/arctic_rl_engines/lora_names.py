"""Names of LoRA adapters and of their tensors, as every engine and the wire spell them.

Adapter tensors travel under peft's export names (``get_peft_model_state_dict``, ``.default``
stripped): ``base_model.model.<module>.lora_A.weight`` ([r, in]) and ``...lora_B.weight``
([out, r]). vLLM serves version ``k`` of adapter ``a`` under its own name ``a@vk``.
"""

from __future__ import annotations

import re

BASE_ADAPTER = "base"
"""The reserved adapter name that serves the base model without any adapter."""

LORA_TENSOR = re.compile(r"\.lora_[AB]\.weight$")
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def is_lora_tensor(name: str) -> bool:
    """True for an adapter tensor's name (``....lora_A.weight`` or ``....lora_B.weight``)."""
    return bool(LORA_TENSOR.search(name))


def is_lora_a(name: str) -> bool:
    """True for a ``lora_A`` tensor's name (shape ``[r, in]``)."""
    return name.endswith(".lora_A.weight")


def vllm_adapter_name(adapter: str, version: int) -> str:
    """The name vLLM serves ``adapter`` at ``version`` under: a new one per version."""
    return f"{adapter}@v{version}"


def bad_adapter_name(name: object) -> str | None:
    """Why ``name`` cannot name a loaded adapter (None when it can)."""
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        return f"adapter name {name!r} must be 1-128 letters, digits, '_', '-' or '.' (not first)"
    if name == BASE_ADAPTER:
        return f"adapter name {BASE_ADAPTER!r} is reserved for the base model without an adapter"
    return None
