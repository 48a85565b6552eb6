"""DeepSpeed configuration for our engines: defaults, ``training_config`` mapping, user overlay.

Order of precedence: our defaults < what ``training_config`` implies < the user's
``ds_config``. Two settings are ours, not the user's: gradient accumulation is driven by
the engine (``managed_gradient_accumulation`` off, ``gradient_accumulation_steps`` 1; the
micro-batch size comes from ``training_config.mb_spec.max_tokens_per_mb``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    EngineConfigError,
    InvalidRequestError,
    OptimizerConfig,
    TrainingConfig,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

DTYPES = ("float32", "bfloat16", "float16")
OPTIMIZER_PARAMS = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
_NOMINAL_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in recursively (``over`` wins); inputs are not changed."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _enabled(section: Any) -> bool | None:
    if isinstance(section, Mapping) and "enabled" in section:
        return bool(section["enabled"])
    return None


def resolve_dtype(
    requested: str | None, user: Mapping[str, Any], *, on_cpu: bool, what: str
) -> str:
    """The model dtype from ``requested`` and the user's ``bf16``/``fp16`` sections.

    float16 on DeepSpeed's CPU accelerator is refused: it has no fp16 support.
    """
    bf16, fp16 = _enabled(user.get("bf16")), _enabled(user.get("fp16"))
    if bf16 and fp16:
        raise EngineConfigError(f"{what}: bf16 and fp16 are both enabled; choose one")
    from_user = "bfloat16" if bf16 else "float16" if fp16 else None
    if requested is not None and requested not in DTYPES:
        raise EngineConfigError(f"{what}: dtype {requested!r} is not one of {list(DTYPES)}")
    if requested and from_user and requested != from_user:
        raise EngineConfigError(
            f"{what}: dtype {requested!r} disagrees with the DeepSpeed config, which enables "
            f"{'bf16' if bf16 else 'fp16'}"
        )
    dtype = from_user or requested or "float32"
    if dtype == "float16" and on_cpu:
        raise EngineConfigError(
            f"{what}: float16 is not supported by DeepSpeed's CPU accelerator; use "
            "'bfloat16' or 'float32' on CPU"
        )
    return dtype


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``float32`` | ``bfloat16`` | ``float16``."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _precision_sections(dtype: str) -> dict[str, Any]:
    return {
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16", "auto_cast": False},
    }


def _check_zero(config: dict[str, Any], what: str) -> int:
    zero = config.setdefault("zero_optimization", {"stage": 0})
    if not isinstance(zero, dict):
        raise EngineConfigError(f"{what}: zero_optimization must be a dict, got {zero!r}")
    stage = zero.setdefault("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise EngineConfigError(f"{what}: zero_optimization.stage={stage!r} is not 0, 1, 2 or 3")
    return int(stage)


@dataclass(frozen=True)
class TrainingSetup:
    """The resolved training settings: the DeepSpeed config and what we do around it."""

    ds_config: dict[str, Any]
    dtype: str
    zero_stage: int
    optimizer: OptimizerConfig
    max_tokens_per_mb: int | None
    gradient_checkpointing: bool
    attn_impl: str | None
    fp32_lm_head: bool
    user_optimizer: bool
    user_scheduler: bool


def training_setup(
    ds_config: Mapping[str, Any] | None,
    training_config: TrainingConfig | None,
    *,
    on_cpu: bool,
) -> TrainingSetup:
    """Merge the user's ``ds_config`` over the defaults implied by ``training_config``."""
    what = "training engine"
    user = dict(ds_config or {})
    tc = training_config or TrainingConfig()
    gas = user.get("gradient_accumulation_steps", 1)
    if gas not in (1, "auto"):
        raise EngineConfigError(
            f"ds_config gradient_accumulation_steps={gas!r}: the engine accumulates over "
            "micro-batches itself; set training_config.mb_spec.max_tokens_per_mb instead"
        )
    if user.get("managed_gradient_accumulation", False):
        raise EngineConfigError(
            "ds_config managed_gradient_accumulation=true is not supported: every step() "
            "is the accumulation boundary"
        )
    user.pop("gradient_accumulation_steps", None)
    for key in _NOMINAL_BATCH_KEYS:
        user.pop(key, None)  # nominal for us: batches arrive whole and are split by tokens
    requested = tc.dtype if training_config is not None else None
    dtype = resolve_dtype(requested, user, on_cpu=on_cpu, what=what)
    opt = tc.optimizer
    clip = float(opt.gradient_clipping or 0.0)
    defaults: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
        "wall_clock_breakdown": False,
        **_precision_sections(dtype),
    }
    merged = deep_merge(defaults, user)
    stage = _check_zero(merged, what)
    if merged["zero_optimization"].get("overlap_comm") and stage != 2:
        merged["zero_optimization"]["overlap_comm"] = False  # only ZeRO-2 supports it here
    return TrainingSetup(
        ds_config=merged,
        dtype=dtype,
        zero_stage=stage,
        optimizer=opt,
        max_tokens_per_mb=tc.mb_spec.max_tokens_per_mb,
        gradient_checkpointing=tc.gradient_checkpointing,
        attn_impl=tc.attn_impl,
        fp32_lm_head=tc.fp32_lm_head,
        user_optimizer="optimizer" in user,
        user_scheduler="scheduler" in user,
    )


# Keys of ``log_prob_ds_config`` that are ours; everything else goes to DeepSpeed.
LOG_PROB_KEYS = ("dtype", "max_tokens_per_mb", "attn_impl", "fp32_lm_head")


@dataclass(frozen=True)
class ForwardSetup:
    """The resolved settings of a forward-only (log-prob or reference) model."""

    ds_config: dict[str, Any]
    dtype: str
    zero_stage: int
    max_tokens_per_mb: int | None
    attn_impl: str | None
    fp32_lm_head: bool = False


def forward_setup(worker_config: Mapping[str, Any] | None, *, on_cpu: bool) -> ForwardSetup:
    """Split ``log_prob_ds_config`` into our keys (dtype, max_tokens_per_mb, attn_impl,
    fp32_lm_head) and
    the DeepSpeed config (ZeRO-3 shards parameters; stages 1-2 mean nothing without an
    optimizer and run as stage 0)."""
    what = "log-prob engine"
    user = dict(worker_config or {})
    ours = {k: user.pop(k) for k in LOG_PROB_KEYS if k in user}
    for key in ("optimizer", "scheduler"):
        if key in user:
            raise EngineConfigError(f"log_prob_ds_config: {key!r} makes no sense forward-only")
    for key in (*_NOMINAL_BATCH_KEYS, "gradient_accumulation_steps"):
        user.pop(key, None)
    requested = ours.get("dtype")
    if isinstance(requested, str):
        requested = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
            requested.lower(), requested.lower()
        )
    dtype = resolve_dtype(requested, user, on_cpu=on_cpu, what=what)
    budget = ours.get("max_tokens_per_mb")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise EngineConfigError(f"{what}: max_tokens_per_mb={budget!r} must be a positive int")
    fp32_head = ours.get("fp32_lm_head", False)
    if not isinstance(fp32_head, bool):
        raise EngineConfigError(f"{what}: fp32_lm_head={fp32_head!r} must be true or false")
    defaults = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 1 << 62,
        **_precision_sections(dtype),
    }
    merged = deep_merge(defaults, user)
    stage = _check_zero(merged, what)
    return ForwardSetup(
        ds_config=merged,
        dtype=dtype,
        zero_stage=stage,
        max_tokens_per_mb=budget,
        attn_impl=ours.get("attn_impl"),
        fp32_lm_head=fp32_head,
    )


def reference_ds_config(training: TrainingSetup) -> dict[str, Any]:
    """DeepSpeed config of the frozen reference model next to a training engine (ZeRO-3 only)."""
    zero = {
        k: v
        for k, v in training.ds_config["zero_optimization"].items()
        if k.startswith("stage3_param") or k in ("stage", "reduce_bucket_size")
    }
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": zero,
        "steps_per_print": 1 << 62,
        **_precision_sections(training.dtype),
    }


class LRSchedule:
    """Learning-rate multiplier per optimizer step: linear warm-up, then constant/linear/cosine.

    Warm-up spans ``round(warmup_fraction * total_steps)`` steps, rising as (s + 1) / W; the
    decay then goes from 1 to 0 over the remaining steps (cosine: half a period).
    """

    def __init__(self, kind: str, warmup_steps: int, total_steps: int | None) -> None:
        self.kind = kind
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant" or self.total_steps is None:
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        if self.kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_schedule(opt: OptimizerConfig) -> LRSchedule:
    """The schedule ``opt`` asks for; linear/cosine and warm-up need ``total_steps``."""
    fraction = opt.warmup_fraction
    needs_total = opt.lr_scheduler_type != "constant" or fraction > 0
    if needs_total and opt.total_steps is None:
        raise EngineConfigError(
            f"optimizer.lr_scheduler_type={opt.lr_scheduler_type!r} with warm-up fraction "
            f"{fraction} needs optimizer.total_steps (the steps the schedule spans)"
        )
    warmup = round(fraction * opt.total_steps) if opt.total_steps else 0
    return LRSchedule(opt.lr_scheduler_type, warmup, opt.total_steps)


def build_optimizer(
    params: Any, opt: OptimizerConfig, *, record_grad_norm: bool, clip: float
) -> torch.optim.Optimizer:
    """torch AdamW from ``opt`` (no DeepSpeed op to JIT-build).

    With ``record_grad_norm`` (ZeRO-0 in fp32, where DeepSpeed keeps no norm) the optimizer
    itself measures the global gradient norm before clipping to ``clip`` and exposes it as
    ``_global_grad_norm``, which DeepSpeed then reports.
    """
    import torch

    class AdamWWithNorm(torch.optim.AdamW):
        """AdamW that measures (and clips) the gradient norm before stepping."""

        clip_norm = clip  # max gradient norm; a step may change it (0 disables clipping)

        def step(self, closure: Any = None) -> Any:
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            if grads:
                norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
                if self.clip_norm > 0:
                    torch.nn.utils.clip_grads_with_norm_(
                        [p for g in self.param_groups for p in g["params"] if p.grad is not None],
                        self.clip_norm,
                        norm,
                    )
                self._global_grad_norm = float(norm)
            return super().step(closure)

    cls = AdamWWithNorm if record_grad_norm else torch.optim.AdamW
    return cls(
        params,
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=True,
    )


def set_optimizer_params(engine: Any, params: Mapping[str, Any]) -> None:
    """Set AdamW's betas, eps, weight decay and the gradient-clipping norm of a DeepSpeed
    ``engine`` from a step's ``optimizer_params``."""
    unknown = sorted(set(params) - set(OPTIMIZER_PARAMS))
    if unknown:
        raise InvalidRequestError(
            f"unknown optimizer_params {unknown}; accepted: {list(OPTIMIZER_PARAMS)}"
        )
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"optimizer_params {key}={value!r} must be a number")
    groups = engine.optimizer.param_groups
    for group in groups:
        beta1, beta2 = group["betas"]
        group["betas"] = (
            float(params.get("beta1", beta1)),
            float(params.get("beta2", beta2)),
        )
        if "eps" in params:
            group["eps"] = float(params["eps"])
        if "weight_decay" in params:
            group["weight_decay"] = float(params["weight_decay"])
    if "grad_clip_norm" in params:
        clip = max(float(params["grad_clip_norm"]), 0.0)
        torch_optimizer = engine.optimizer
        if hasattr(torch_optimizer, "clip_norm"):  # our AdamW measures and clips itself
            torch_optimizer.clip_norm = clip
        else:  # DeepSpeed clips: its config, and a ZeRO optimizer's own copy
            engine._config.gradient_clipping = clip
            if hasattr(torch_optimizer, "clip_grad"):
                torch_optimizer.clip_grad = clip


def reset_optimizer_state(optimizer: Any) -> None:
    """Forget AdamW's moments and step counts: a fresh optimizer on the same parameters.

    DeepSpeed's ZeRO and bf16 optimizers hold the torch one as ``.optimizer`` (over their
    fp32 partitions); torch's AdamW builds the state again on its next step.
    """
    inner = getattr(optimizer, "optimizer", optimizer)
    inner.state.clear()
