"""Hugging Face models under DeepSpeed: loading, full-weight export, in-place loads, norms.

ZeRO-3 keeps only a shard of each parameter on a rank; the helpers here gather them
(collectively: every rank must call them with the same arguments) so callers always see
full tensors under Hugging Face names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import EngineError

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

CHECKPOINT_MARKER = "arctic_rl_checkpoint.json"
HF_EXPORT_DIR = "hf"
GATHER_ELEMENTS = 1 << 26  # parameters gathered together when exporting ZeRO-3 weights


def weights_source(path: str) -> str:
    """Where to read Hugging Face weights: an Arctic RL checkpoint's ``hf`` export, or ``path``."""
    p = Path(path)
    if (p / CHECKPOINT_MARKER).is_file() and (p / HF_EXPORT_DIR).is_dir():
        return str(p / HF_EXPORT_DIR)
    return path


def load_causal_lm(
    path: str, *, dtype: str, attn_impl: str | None, fp32_lm_head: bool = False
) -> Any:
    """``AutoModelForCausalLM.from_pretrained(path)`` in ``dtype`` with ``attn_impl`` (and
    its output projection in float32 with ``fp32_lm_head``)."""
    import transformers

    from arctic_rl_engines.ds_config import torch_dtype

    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype)}
    if attn_impl:
        kwargs["attn_implementation"] = attn_impl
    try:
        module = transformers.AutoModelForCausalLM.from_pretrained(weights_source(path), **kwargs)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot load a causal LM from {path!r}: {exc}") from exc
    if fp32_lm_head and fp32_output_head(module):
        logger.info("%s: logits computed in float32 (fp32_lm_head) beside %s weights", path, dtype)
    return module


def fp32_output_head(module: Any) -> bool:
    """Make ``module``'s output projection (``lm_head``) compute its logits in float32 from
    its own (e.g. bfloat16) weight: float32 accumulation, no rounding of the logits. The
    weight stays as it is and gets its gradient through the cast. False when the head is
    float32 already (nothing to do)."""
    import torch
    import torch.nn.functional as F

    head = module.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is None:
        raise EngineError(f"fp32_lm_head: {type(module).__name__} has no output projection")
    if weight.dtype == torch.float32:
        return False

    def forward(hidden: Any) -> Any:
        bias = head.bias
        return F.linear(hidden.float(), head.weight.float(), None if bias is None else bias.float())

    head.forward = forward
    return True


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved with the model at ``path``, or None when there is none."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(weights_source(path))
    except (OSError, ValueError) as exc:
        logger.warning("no tokenizer at %s (%s); checkpoints will hold weights only", path, exc)
        return None


def model_limits(config: Any) -> tuple[int, int | None, int]:
    """(vocab size, max context or None, a valid padding token id) of a model config."""
    vocab = int(config.vocab_size)
    context = getattr(config, "max_position_embeddings", None)
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int) or not 0 <= pad < vocab:
        pad = 0
    return vocab, (int(context) if context else None), pad


def is_zero3_param(param: Any) -> bool:
    """True for a parameter that ZeRO-3 has partitioned."""
    return hasattr(param, "ds_id")


def _param_groups(params: list[tuple[str, Any]]) -> Iterator[list[tuple[str, Any]]]:
    group: list[tuple[str, Any]] = []
    size = 0
    for name, p in params:
        numel = int(getattr(p, "ds_numel", p.numel()))
        if group and size + numel > GATHER_ELEMENTS:
            yield group
            group, size = [], 0
        group.append((name, p))
        size += numel
    if group:
        yield group


def full_weights(module: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter as a full CPU tensor in its HF name (ZeRO-3: gathered in groups).

    Collective under ZeRO-3: all ranks must consume the iterator to the end.
    """
    import deepspeed

    params = list(module.named_parameters())
    if not any(is_zero3_param(p) for _, p in params):
        for name, p in params:
            yield name, p.detach().cpu().clone()
        return
    for group in _param_groups(params):
        with deepspeed.zero.GatheredParameters([p for _, p in group], modifier_rank=None):
            tensors = [(name, p.detach().cpu().clone()) for name, p in group]
        yield from tensors


def weight_norm(module: Any) -> float:
    """L2 norm (float64 sum) of all parameters; ZeRO-3 sums its shards and all-reduces."""
    import torch
    import torch.distributed as dist

    total = torch.zeros((), dtype=torch.float64)
    sharded = False
    for _, p in module.named_parameters():
        if is_zero3_param(p):
            sharded = True
            t = p.ds_tensor
        else:
            t = p.data
        total += t.detach().to(torch.float64).square().sum().cpu()
    if sharded and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return float(total.sqrt())


def load_weights(module: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy ``(name, tensor)`` pairs into the matching parameters in place; returns how many.

    Names are Hugging Face names (tied aliases accepted). Collective under ZeRO-3.
    """
    import deepspeed
    import torch

    by_name = dict(module.named_parameters(remove_duplicate=False))
    count = 0
    for name, tensor in weights:
        param = by_name.get(name)
        if param is None:
            known = sorted(by_name)
            raise EngineError(
                f"weight {name!r} is not a parameter of this model ({len(known)} known, e.g. "
                f"{known[:3]})"
            )
        shape = tuple(param.ds_shape) if is_zero3_param(param) else tuple(param.shape)
        if tuple(tensor.shape) != shape:
            raise EngineError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, the model's is {shape}"
            )
        with torch.no_grad():
            if is_zero3_param(param):
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    param.data.copy_(tensor.to(param.device, param.dtype))
            else:
                param.data.copy_(tensor.to(param.device, param.dtype))
        count += 1
    return count


class ForwardModel:
    """A frozen causal LM for forward passes only: plain module, or a ZeRO-3 DeepSpeed engine."""

    def __init__(
        self,
        path: str,
        *,
        ds_config: dict[str, Any],
        dtype: str,
        zero_stage: int,
        attn_impl: str | None,
        device: Any,
        prepare: Callable[[Any], Any] | None = None,
        fp32_lm_head: bool = False,
    ) -> None:
        """``prepare`` (e.g. peft wrapping) gets the loaded module before DeepSpeed does."""
        import deepspeed

        module = load_causal_lm(path, dtype=dtype, attn_impl=attn_impl, fp32_lm_head=fp32_lm_head)
        if prepare is not None:
            module = prepare(module)
        module.requires_grad_(False)
        module.eval()
        self.module = module
        self.config = module.config
        self.engine: Any = None
        if zero_stage == 3:
            self.engine, *_ = deepspeed.initialize(model=module, config=ds_config)
            self.engine.eval()
            self._call: Any = self.engine
        else:
            module.to(device)
            self._call = module

    def __call__(self, **kwargs: Any) -> Any:
        """Forward (the module's output, with ``.logits``)."""
        return self._call(**kwargs)

    def close(self) -> None:
        """Drop the model and DeepSpeed's hooks."""
        if self.engine is not None:
            self.engine.destroy()
        self.engine = self._call = self.module = None
