"""LoRA mode of the DeepSpeed engines: peft wrapping, adapter export, adapter checkpoints.

A job is in LoRA mode when ``training_config.lora`` is set. The base model is wrapped with
``peft.get_peft_model`` before ``deepspeed.initialize`` and stays frozen; only the adapter's
``lora_A``/``lora_B`` tensors train, cross the wire (under peft's export names, ``.default``
stripped) and go into checkpoints. Under ZeRO-3 only the LoRA parameters are gathered.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    CheckpointError,
    EngineConfigError,
    InvalidRequestError,
    LoraConfig,
)
from arctic_rl_engines.ds_model import is_zero3_param
from arctic_rl_engines.lora_format import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config_dict

if TYPE_CHECKING:  # pragma: no cover
    import torch

ADAPTER_DIR = "adapter"
LORA_MARKER = ".lora_"  # in every LoRA parameter's name: ``...q_proj.lora_A.default.weight``


def lora_of(config: Any) -> LoraConfig | None:
    """The job's LoRA settings (``training_config.lora``), or None in full-weight mode."""
    training = getattr(config, "training_config", None)
    return None if training is None else training.lora


def linear_modules(module: Any) -> list[str]:
    """The full names of the model's linear layers (what LoRA can target)."""
    import torch

    return [n for n, sub in module.named_modules() if n and isinstance(sub, torch.nn.Linear)]


def check_targets(module: Any, lora: LoraConfig) -> None:
    """Refuse a target that names no linear layer (peft's rule: the module's name or a
    dotted suffix of it), naming the layers the model has."""
    full = linear_modules(module)
    unknown = [
        t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in full)
    ]
    if unknown:
        have = sorted({n.rsplit(".", 1)[-1] for n in full})
        raise EngineConfigError(
            f"training_config.lora.target_modules {unknown} match no linear layer of this "
            f"model; its linear layers are named {have}"
        )


def wrap(module: Any, lora: LoraConfig, seed: int) -> Any:
    """``module`` wrapped by peft with a fresh adapter (``lora_B`` = 0, ``lora_A`` drawn from
    ``lora.seed`` or ``seed``, without moving the caller's RNG); the base frozen."""
    import torch

    try:
        import peft
    except ImportError as exc:
        raise EngineConfigError(
            f"training_config.lora needs peft (the deepspeed extra installs it): {exc}"
        ) from exc
    check_targets(module, lora)
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=lora.dropout,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lora.seed if lora.seed is not None else seed)
        wrapped = peft.get_peft_model(module, config, autocast_adapter_dtype=False)
    return wrapped


def lora_parameters(module: Any) -> list[tuple[str, Any]]:
    """The adapter's parameters ``(name, param)`` of a peft-wrapped module."""
    return [(n, p) for n, p in module.named_parameters() if LORA_MARKER in n]


def export(module: Any) -> dict[str, torch.Tensor]:
    """The adapter as full CPU tensors under peft's export names.

    Under ZeRO-3 only the LoRA parameters are gathered (collective: every rank calls it).
    """
    from peft import get_peft_model_state_dict

    sharded = [p for _, p in lora_parameters(module) if is_zero3_param(p)]
    gather: Any = contextlib.nullcontext()
    if sharded:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(sharded, modifier_rank=None)
    with gather:
        state = get_peft_model_state_dict(module, save_embedding_layers=False)
        return {name: t.detach().cpu().clone() for name, t in state.items()}


def param_name(export_name: str, adapter: str = "default") -> str:
    """The parameter an exported adapter tensor belongs to (peft's adapter name put back)."""
    head, _, kind = export_name.rpartition(".lora_")
    return f"{head}.lora_{kind[:1]}.{adapter}{kind[1:]}"


def checked_adapter(
    module: Any, weights: Iterable[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``weights`` as ``(parameter name, tensor)`` pairs once they are checked to be exactly
    this adapter's tensors (no base weight, none missing)."""
    from arctic_rl_engines.lora_names import is_lora_tensor

    items = list(weights)
    full = [name for name, _ in items if not is_lora_tensor(name)]
    if full:
        raise InvalidRequestError(
            f"a full-weight sync into a LoRA job: {len(full)} tensor(s) are not adapter "
            f"tensors (e.g. {full[:3]}); the base is frozen, sync the adapter only"
        )
    pairs = [(param_name(name), t) for name, t in items]
    missing = {n for n, _ in lora_parameters(module)} - {n for n, _ in pairs}
    if missing:
        raise InvalidRequestError(
            f"an adapter sync must carry the whole adapter: {len(missing)} of its tensors are "
            f"missing (e.g. {sorted(missing)[:2]})"
        )
    return pairs


def refuse_adapter(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """``weights`` as a list once none is an adapter tensor (a full-weight job's check)."""
    from arctic_rl_engines.lora_names import is_lora_tensor

    items = list(weights)
    adapter = [name for name, _ in items if is_lora_tensor(name)]
    if adapter:
        raise InvalidRequestError(
            f"adapter tensors (e.g. {adapter[:2]}) sent to a job that serves full weights; "
            "set training_config.lora on the job to serve adapters"
        )
    return items


def info(lora: LoraConfig, module: Any, dtype: str) -> dict[str, Any]:
    """``lora_info()``: rank, alpha, targets, and the adapter's tensor, parameter and byte counts
    (``dtype``: the training dtype's name); no collective."""
    import math

    from arctic_rl_engines.ds_config import torch_dtype

    params = [p for _, p in lora_parameters(module)]
    numel = sum(math.prod(p.ds_shape) if is_zero3_param(p) else int(p.numel()) for p in params)
    return {
        "rank": lora.rank,
        "alpha": lora.alpha,
        "target_modules": list(lora.target_modules),
        "tensors": len(params),
        "params": numel,
        "bytes": numel * torch_dtype(dtype).itemsize,
    }


def save_adapter(
    directory: Path, tensors: Mapping[str, torch.Tensor], lora: LoraConfig, base_model: str
) -> Path:
    """Write a PEFT adapter directory (``adapter_config.json`` + safetensors) vLLM can load."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = adapter_config_dict(lora, lora.rank, base_model=base_model)
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(directory / ADAPTER_WEIGHTS),
        metadata={"format": "pt"},
    )
    return directory


def load_adapter(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors of a PEFT adapter directory (export names)."""
    from safetensors.torch import load_file

    path = directory / ADAPTER_WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{directory} holds no {ADAPTER_WEIGHTS}")
    return load_file(str(path))


def marker_fields(
    lora: LoraConfig | None, base_model: str, adapter: str | None = None
) -> dict[str, Any]:
    """What a checkpoint's marker records about the mode: the LoRA settings, the base and
    which adapter the checkpoint holds."""
    if lora is None:
        return {"lora": None}
    return {"lora": lora.model_dump(mode="json"), "base_model": base_model, "adapter": adapter}


def _signature(settings: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        int(settings["rank"]),
        float(settings["alpha"]),
        tuple(sorted(settings["target_modules"])),
    )


def check_mode(meta: Mapping[str, Any], lora: LoraConfig | None, path: Path) -> None:
    """Refuse a checkpoint written in the other mode (LoRA vs full) or with other LoRA settings."""
    saved = meta.get("lora")
    if saved and lora is None:
        raise CheckpointError(
            f"{path} is a LoRA checkpoint (rank {saved.get('rank')}, base "
            f"{meta.get('base_model')!r}) but this job trains full weights; set "
            "training_config.lora to its settings to resume it"
        )
    if not saved and lora is not None:
        raise CheckpointError(
            f"{path} is a full-weight checkpoint but this job trains a LoRA adapter; its "
            f"Hugging Face export {path / 'hf'} can be a LoRA run's base (checkpoint_path)"
        )
    if saved and lora is not None:
        mine = lora.model_dump(mode="json")
        if _signature(saved) != _signature(mine):
            raise CheckpointError(
                f"{path} holds a LoRA adapter with rank {saved['rank']}, alpha "
                f"{saved['alpha']}, targets {saved['target_modules']}; this job's "
                f"training_config.lora has rank {lora.rank}, alpha {lora.alpha}, targets "
                f"{lora.target_modules}"
            )


def trainable(module: Any) -> Iterable[Any]:
    """The parameters an optimizer should hold (the adapter's in LoRA mode)."""
    return [p for p in module.parameters() if p.requires_grad]
