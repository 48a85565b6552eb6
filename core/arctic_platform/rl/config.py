"""Client configuration: ``ArcticRLClientConfig`` and ``WeightSyncConfig``.

Field names, types, defaults and descriptions follow the configuration reference. Where the
reference has a ``Literal`` of built-in names (``backend``, ``comm_protocol``,
``log_prob_engine``), any name registered by an installed plugin is accepted, and an
unknown one is a ValidationError listing what is installed.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from arctic_platform.rl.errors import PluginError

logger = logging.getLogger(__name__)

JOB_ID_FIELDS: frozenset[str] = frozenset({"training_job_id", "sampling_job_id", "log_prob_job_id"})

LrSchedulerType = Literal["constant", "linear", "cosine"]
_DTYPE_ALIASES = {
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}


class OptimizerConfig(BaseModel):
    """AdamW and learning-rate schedule settings of the training engine."""

    model_config = ConfigDict(extra="allow")

    lr: float = Field(default=1e-5, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler_type: LrSchedulerType = Field(
        default="constant", description="Learning-rate schedule after warm-up."
    )
    gradient_clipping: float | None = Field(
        default=1.0, ge=0, description="Max global gradient norm; None or 0 disables clipping."
    )
    warmup_steps_proportion: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of total steps spent warming up."
    )
    warmup_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Alias of warmup_steps_proportion."
    )
    total_steps: int | None = Field(
        default=None, gt=0, description="Steps the schedule spans (linear/cosine decay, warm-up)."
    )

    @model_validator(mode="after")
    def _warmup_aliases_agree(self) -> OptimizerConfig:
        a, b = self.warmup_steps_proportion, self.warmup_ratio
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"warmup_steps_proportion={a} and warmup_ratio={b} disagree; they are aliases, "
                "set one of them"
            )
        return self

    @property
    def warmup_fraction(self) -> float:
        """The warm-up fraction from either alias (0.0 when neither is set)."""
        value = self.warmup_steps_proportion
        if value is None:
            value = self.warmup_ratio
        return float(value or 0.0)


class MicroBatchSpec(BaseModel):
    """How a batch is split into micro-batches (token budget per micro-batch)."""

    model_config = ConfigDict(extra="allow")

    max_tokens_per_mb: int | None = Field(
        default=None, gt=0, description="Token budget of one micro-batch; None = whole batch."
    )


LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM can serve (``max_lora_rank``); an adapter of a rank in between is
served under the next one up."""
DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)
"""Attention, MLP and unembedding: what Tinker trains by default."""
DEFAULT_ADAPTER = "default"
"""The adapter name a job uses when a request names none."""


class LoraConfig(BaseModel):
    """LoRA training: the base model stays frozen; only the adapter is trained and synced."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(default=32, ge=1, le=LORA_RANKS[-1], description="Adapter rank r.")
    alpha: float = Field(
        default=32.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        description=(
            "Module names (suffixes) that get an adapter; the default is attention, MLP and "
            "lm_head. A name the model does not have is an error when the job starts."
        ),
    )
    dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="LoRA dropout (0 keeps trainer and sampler log-probs identical).",
    )
    seed: int | None = Field(
        default=None, description="Seed of the adapter's initial A matrices (None: the run's)."
    )

    @field_validator("target_modules")
    @classmethod
    def _plain_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not isinstance(name, str) or not name.strip()]
        if bad:
            raise ValueError(f"target_modules must be non-empty module names, got {bad}")
        return list(dict.fromkeys(name.strip() for name in value))

    @property
    def served_rank(self) -> int:
        """The smallest rank vLLM serves that holds this adapter (``max_lora_rank``)."""
        return next(r for r in LORA_RANKS if r >= self.rank)


class TrainingConfig(BaseModel):
    """The standard fields of ``training_config``; unknown extra fields are kept."""

    model_config = ConfigDict(extra="allow")

    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    dtype: str = Field(default="float32", description="float32 | bfloat16 | float16.")
    gradient_checkpointing: bool = False
    attn_impl: str | None = Field(default=None, description="eager | sdpa | flash_attention_2.")
    fp32_lm_head: bool = Field(
        default=False,
        description=(
            "Compute the output projection (logits) in float32 while the model runs in "
            "bfloat16/float16, in the trainer and its reference model (extension)."
        ),
    )
    mb_spec: MicroBatchSpec = Field(default_factory=MicroBatchSpec)
    lora: LoraConfig | None = Field(
        default=None,
        description=(
            "Train a LoRA adapter instead of the full weights (extension): the base is "
            "frozen, weight syncs move only the adapter, samplers serve it through vLLM's LoRA."
        ),
    )

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        key = value.strip().lower()
        if key not in _DTYPE_ALIASES:
            raise ValueError(
                f"dtype {value!r} is not one of {sorted(set(_DTYPE_ALIASES.values()))} "
                f"(aliases: {sorted(k for k in _DTYPE_ALIASES if k != _DTYPE_ALIASES[k])})"
            )
        return _DTYPE_ALIASES[key]

    @property
    def extra_fields(self) -> dict[str, Any]:
        """Fields not in the standard set, which the engines ignore."""
        return dict(self.model_extra or {})


def _registered(kind: str, value: str, field: str, role: str | None = None) -> str:
    from arctic_platform.rl.plugins.registry import get_registry

    try:
        spec = get_registry().get(kind, value, role=role, field=field)
    except PluginError as exc:
        raise ValueError(str(exc)) from None
    return str(spec.name)


class ArcticRLClientConfig(BaseModel):
    """Configuration of the Arctic RL client: backend, transport, model, GPUs and timeouts."""

    model_config = ConfigDict(extra="forbid", validate_default=False)

    # Backend & Communication
    backend: str = Field(default="local", description="Backend platform for job execution.")
    comm_protocol: str = Field(
        default="http", description="Communication protocol between client and server."
    )
    host: str | None = Field(
        default=None,
        description=(
            "Server hostname. Auto-derived from `comm_protocol` unless explicitly set. For "
            "`http`, defaults to the primary network IP. For `ray`, remains `None`."
        ),
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "Server port. Auto-derived from `comm_protocol` unless explicitly set. For "
            "`http`, defaults to `7000`. For `ray`, remains `None`."
        ),
    )

    # Model & Checkpoint
    model_name: str = Field(
        ..., min_length=1, description="Model name or HuggingFace ID to load on all engines."
    )
    checkpoint_path: str | None = Field(
        default=None, description="Path to model checkpoint for resuming training."
    )

    # Engine Configuration
    ds_config: dict[str, Any] = Field(
        default_factory=dict, description="DeepSpeed configuration for the training engine."
    )
    training_config: TrainingConfig | None = Field(
        default=None,
        description=(
            "Training worker config (optimizer settings, dtype, gradient checkpointing, "
            "attention implementation, max tokens per microbatch, etc.). Standard fields "
            "include `optimizer` (lr, weight_decay, beta1, beta2, eps, lr_scheduler_type, "
            "gradient_clipping, warmup_steps_proportion/warmup_ratio), `dtype`, "
            "`gradient_checkpointing`, `attn_impl`, and `mb_spec`. Extra fields are ignored "
            "by the server."
        ),
    )
    vllm_config: dict[str, Any] | None = Field(
        default=None,
        description="vLLM / ModelConfig overrides for sampling and log-prob engines.",
    )
    log_prob_ds_config: dict[str, Any] | None = Field(
        default=None,
        description="Log-prob DeepSpeed worker configuration (batch size, dtype, etc.).",
    )
    ds_worker_config: dict[str, Any] | None = Field(
        default=None, description="DeepSpeed worker configuration (optimizer, dtype, etc.)."
    )
    arctic_inference_config: dict[str, Any] | None = Field(
        default=None,
        description="Arctic inference configuration (use_fca, spec_model, etc.).",
    )

    # GPU Resources
    training_gpus: int = Field(
        default=0, ge=0, description="Number of GPUs allocated to the DeepSpeed training engine."
    )
    sampling_gpus: int = Field(
        default=0, ge=0, description="Number of GPUs allocated to the vLLM sampling engine."
    )
    log_prob_gpus: int = Field(
        default=0, ge=0, description="Number of GPUs allocated to the log-prob engine."
    )
    log_prob_engine: str = Field(default="vllm", description="Engine backend for the log-prob job.")
    colocate: bool = Field(
        default=False,
        description=(
            "If `True`, colocate training, sampling, and log-prob workers on the same GPUs "
            "using fractional Ray resources."
        ),
    )

    # Training & Determinism
    full_determinism: bool = Field(
        default=False,
        description=(
            "If `True`, the DeepSpeed worker calls `enable_full_determinism()` for "
            "reproducible training."
        ),
    )
    seed: int = Field(
        default=42,
        description="Seed used by `enable_full_determinism()` when `full_determinism=True`.",
    )

    # Ray Cluster & Startup
    ray_auto_attach: bool = Field(
        default=True,
        description=(
            "If `True`, the local server attempts to attach to a pre-existing Ray cluster "
            "(only honored when that cluster has GPU resources). Set to `False` to always "
            "start a fresh Ray cluster—useful when an unrelated CPU-only Ray cluster is running."
        ),
    )
    server_logs: bool = Field(
        default=True, description="If `True`, display server subprocess stdout/stderr."
    )
    startup_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds to wait for the local server to become healthy during initialization.",
    )
    health_check_interval: float = Field(
        default=2.0, gt=0, description="Seconds between health-check polls during server startup."
    )
    job_ready_timeout: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Seconds to wait for each job (training, sampling, log-prob) to reach RUNNING "
            "state after `/initialize`."
        ),
    )

    # Reconnection
    training_job_id: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Job ID for reconnecting to an existing training job. Populated by "
            "`ArcticRLClient.reconnect_config()` and consumed in `ArcticRLClient.__init__()`. "
            "Not forwarded to `/initialize`."
        ),
    )
    sampling_job_id: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Job ID for reconnecting to an existing sampling job. Not forwarded to `/initialize`."
        ),
    )
    log_prob_job_id: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Job ID for reconnecting to an existing log-prob job. Not forwarded to `/initialize`."
        ),
    )

    # Extensions beyond the reference: the engines of the other two roles, by registered name.
    training_engine: str = Field(
        default="deepspeed", description="Engine backend for the training job (extension)."
    )
    sampling_engine: str = Field(
        default="vllm", description="Engine backend for the sampling job (extension)."
    )

    @field_validator("backend")
    @classmethod
    def _backend_registered(cls, value: str) -> str:
        return _registered("backend", value, "backend")

    @field_validator("comm_protocol")
    @classmethod
    def _transport_registered(cls, value: str) -> str:
        return _registered("transport", value, "comm_protocol")

    @field_validator("log_prob_engine", "training_engine", "sampling_engine")
    @classmethod
    def _engine_registered(cls, value: str, info: ValidationInfo) -> str:
        field = str(info.field_name)  # <role>_engine
        return _registered("engine", value, field, role=field.removesuffix("_engine"))

    @field_validator("training_config")
    @classmethod
    def _log_ignored_training_fields(cls, value: TrainingConfig | None) -> TrainingConfig | None:
        if value is not None and value.model_extra:
            logger.debug(
                "training_config: extra fields kept, ignored by the server: %s",
                sorted(value.model_extra),
            )
        return value

    @model_validator(mode="after")
    def _check_gpus_and_derive_address(self) -> ArcticRLClientConfig:
        from arctic_platform.rl.plugins.registry import get_registry

        needs_gpus = get_registry().get("backend", self.backend).needs_gpus
        if needs_gpus and not self.reconnect_mode:
            counts = (self.training_gpus, self.sampling_gpus, self.log_prob_gpus)
            if not any(c > 0 for c in counts):
                raise ValueError(
                    f"backend={self.backend!r} needs at least one of training_gpus, "
                    "sampling_gpus or log_prob_gpus > 0 (all are 0); set the GPUs each job "
                    "should get, or set training_job_id / sampling_job_id / log_prob_job_id to "
                    "reconnect to running jobs"
                )
        backend = get_registry().get("backend", self.backend)
        spoken = getattr(backend, "transports", ())
        if spoken and self.comm_protocol not in spoken:
            raise ValueError(
                f"backend={self.backend!r} speaks comm_protocol "
                f"{' or '.join(repr(t) for t in spoken)} only; got "
                f"comm_protocol={self.comm_protocol!r} (set comm_protocol={spoken[0]!r})"
            )
        transport = get_registry().get("transport", self.comm_protocol)
        if transport.network_address:
            if self.host is None:
                from arctic_platform.rl.network import primary_ipv4

                self.host = primary_ipv4()
            if self.port is None:
                self.port = transport.default_port
        return self

    @property
    def reconnect_mode(self) -> bool:
        """True when the config names existing jobs to attach to instead of creating them."""
        return any(getattr(self, f) is not None for f in JOB_ID_FIELDS)

    def initialize_payload(self) -> dict[str, Any]:
        """What ``/initialize`` receives: the config as JSON, without the three job ids."""
        return self.model_dump(mode="json", exclude=set(JOB_ID_FIELDS))

    def for_reconnect(
        self,
        *,
        training_job_id: int | None = None,
        sampling_job_id: int | None = None,
        log_prob_job_id: int | None = None,
        host: str | None = None,
        port: int | None = None,
    ) -> ArcticRLClientConfig:
        """A validated copy with job ids (and host/port, when given) filled in for reconnecting."""
        data = self.model_dump()
        updates = {
            "training_job_id": training_job_id,
            "sampling_job_id": sampling_job_id,
            "log_prob_job_id": log_prob_job_id,
        }
        data.update(updates)
        if host is not None:
            data["host"] = host
        if port is not None:
            data["port"] = port
        return type(self).model_validate(data)


class WeightSyncConfig(BaseModel):
    """NCCL (gloo on CPU) weight-transfer topology between training ranks and inference replicas."""

    model_config = ConfigDict(extra="forbid")

    training_sharding: Literal["dp", "fsdp"] = Field(
        default="dp",
        description=(
            'Training parallelism strategy: `"dp"` (data parallel) or `"fsdp"` '
            "(fully sharded data parallel)."
        ),
    )
    training_gpus: int = Field(default=1, ge=1, description="Number of training GPUs.")
    inference_replicas: int = Field(default=1, ge=1, description="Number of inference replicas.")
    inference_tp: int = Field(
        default=1, ge=1, description="Tensor parallelism degree for inference replicas."
    )
    base_port: int = Field(
        default=29500, ge=1, le=65535, description="Base port for NCCL communication."
    )
    bucket_size: int = Field(
        default=268435456, gt=0, description="Bucket size for weight synchronization in bytes."
    )

    @model_validator(mode="after")
    def _ports_in_range(self) -> WeightSyncConfig:
        last = self.base_port + self.inference_replicas * self.inference_tp - 1
        if last > 65535:
            raise ValueError(
                f"base_port={self.base_port} with {self.inference_replicas} replicas x "
                f"tp {self.inference_tp} needs ports up to {last}, past 65535"
            )
        return self


REFERENCE_MODELS: tuple[type[BaseModel], ...] = (
    ArcticRLClientConfig,
    TrainingConfig,
    OptimizerConfig,
    MicroBatchSpec,
    LoraConfig,
    WeightSyncConfig,
)
"""Every config model, in the order a user meets them (the configuration reference's order)."""
