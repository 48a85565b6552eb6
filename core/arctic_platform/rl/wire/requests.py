"""Request models of every server operation (pydantic), shared by server and client."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from arctic_platform.rl.batch import Batch

JobType = Literal["training", "sampling", "log_prob"]
JOB_TYPES: tuple[JobType, ...] = ("training", "sampling", "log_prob")
CHECKPOINT_TAG_PATTERN = r"^[^./\\\x00][^/\\\x00]*$"
"""A checkpoint tag is one visible directory name (no separator, no NUL, no leading dot)."""


def describe_errors(exc: ValidationError) -> str:
    """Every error of a pydantic ValidationError as 'field.path: message', joined by '; '."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _not_a_bool(value: Any) -> Any:
    """Refuse JSON ``true``/``false`` where a job id is meant (pydantic would read 1/0)."""
    if isinstance(value, bool):
        raise ValueError("a job id is an integer, not a boolean")
    return value


JobId = Annotated[int, Field(ge=0), BeforeValidator(_not_a_bool)]
"""A job id: a non-negative integer (booleans refused)."""


BatchField = Annotated[
    Batch,
    PlainValidator(Batch.build),
    PlainSerializer(lambda batch: batch.to_lists(), return_type=dict[str, Any]),
    WithJsonSchema({"additionalProperties": True, "title": "Batch", "type": "object"}),
]
"""A request's batch: lists of rows or dense arrays with an ``attention_mask``, built into a
``Batch`` (structure checked) as the request is read; the job's limits are checked later."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class InitializeRequest(_Request):
    """Create one job of ``job_type`` from a client config (without job ids)."""

    job_type: JobType
    config: dict[str, Any]
    colocation_group: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="Colocated jobs only (config colocate=true): the set of shared GPU bundles "
        "the job joins; jobs of one name share theirs, other names get their own (default: "
        "the server's one shared set).",
    )


class JobRequest(_Request):
    """An operation on one job."""

    job_id: JobId


class GetJobRequest(JobRequest):
    """One job's public view; ``request_id`` also asks what its request-id ledger holds."""

    request_id: str | None = Field(
        default=None,
        max_length=128,
        description=(
            "A fwd_bwd or step request id of this training job: the answer's `request` gives, "
            "per operation, the step it was applied on and `rolled_back_to` (a checkpoint load "
            "undid it), or null when the ledger holds no such id."
        ),
    )


ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"
"""An adapter name: letters, digits, ``_``, ``-`` and ``.`` (not first); ``base`` = no adapter."""


def _adapter_field(what: str) -> Any:
    return Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=ADAPTER_NAME_PATTERN,
        description=what,
    )


def _adapter_version_field() -> Any:
    return Field(
        default=None,
        ge=0,
        description="The adapter version to serve (default: its latest); needs a LoRA job.",
    )


_SERVE_ADAPTER = (
    "A LoRA job's adapter to serve ('base': the base model without any adapter; default: "
    "the job's default adapter at its latest version, or the base before any adapter sync)."
)


class TrainingAdapterRequest(JobRequest):
    """An operation on a training job that may name one of its LoRA adapters."""

    adapter: str | None = _adapter_field(
        "LoRA training jobs only: the named adapter to work on (add_adapter makes more than "
        "the default one; default: the adapter the job worked on last)."
    )

    def adapter_kwargs(self) -> dict[str, Any]:
        """``adapter`` as an engine keyword when set."""
        return {} if self.adapter is None else {"adapter": self.adapter}


class FwdBwdRequest(TrainingAdapterRequest):
    """Forward/backward of ``loss_fn`` over ``batch``; ``request_id`` makes a retry safe."""

    batch: BatchField
    loss_fn: str = "grpo"
    loss_config: dict[str, Any] | None = None
    request_id: str | None = Field(default=None, max_length=128)
    return_log_probs: bool = Field(
        default=False, description="Also answer each row's per-token log-probs (log_probs)."
    )
    forward_only: bool = Field(
        default=False, description="Compute the loss and outputs without any gradient."
    )


class FwdNoGradRequest(TrainingAdapterRequest):
    """Per-token log-probs of ``batch`` from the training (or reference) model."""

    batch: BatchField
    reference_model: bool = False


class StepRequest(TrainingAdapterRequest):
    """One optimizer step, optionally at ``learning_rate`` and with new AdamW settings."""

    learning_rate: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=128)
    beta1: float | None = Field(default=None, ge=0, lt=1, description="AdamW beta1 from now on.")
    beta2: float | None = Field(default=None, ge=0, lt=1, description="AdamW beta2 from now on.")
    eps: float | None = Field(default=None, gt=0, description="AdamW epsilon from now on.")
    weight_decay: float | None = Field(
        default=None, ge=0, description="Decoupled weight decay from now on."
    )
    grad_clip_norm: float | None = Field(
        default=None, ge=0, description="Max global gradient norm from now on; 0 disables it."
    )

    def optimizer_params(self) -> dict[str, float]:
        """The AdamW settings this step changes (only those given)."""
        names = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
        return {n: float(getattr(self, n)) for n in names if getattr(self, n) is not None}


class SaveCheckpointRequest(TrainingAdapterRequest):
    """Save the training state under the job's checkpoint root as ``tag``."""

    tag: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=CHECKPOINT_TAG_PATTERN,
        description="One directory name: no '/' or '\\', not starting with '.'.",
    )


class LoadCheckpointRequest(TrainingAdapterRequest):
    """Load a checkpoint by ``path`` (inside the checkpoint root), ``step``, or the latest."""

    path: str | None = None
    step: int | None = Field(default=None, ge=0)
    optimizer: bool = Field(
        default=True,
        description="Also restore the optimizer state; false: the weights, step and schedule "
        "with fresh AdamW moments.",
    )


class AddAdapterRequest(JobRequest):
    """Add a named LoRA adapter to a training job: fresh weights and optimizer state."""

    adapter: str = Field(min_length=1, max_length=128, pattern=ADAPTER_NAME_PATTERN)
    seed: int | None = Field(
        default=None, ge=0, description="Draws lora_A (default: the job's lora.seed or seed)."
    )


class RemoveAdapterRequest(JobRequest):
    """Drop a named LoRA adapter: from a training job, or every version a sampling or log-prob
    job serves."""

    adapter: str = Field(min_length=1, max_length=128, pattern=ADAPTER_NAME_PATTERN)


class AdapterRequest(JobRequest):
    """An operation on a job that may serve a LoRA adapter (``adapter`` at ``adapter_version``)."""

    adapter: str | None = _adapter_field(_SERVE_ADAPTER)
    adapter_version: int | None = _adapter_version_field()

    def adapter_kwargs(self) -> dict[str, Any]:
        """``adapter``/``adapter_version`` as engine keywords, only those set."""
        named = {"adapter": self.adapter, "adapter_version": self.adapter_version}
        return {k: v for k, v in named.items() if v is not None}


class GenerateRequest(AdapterRequest):
    """Sample completions for ``prompts`` (strings or token-id lists)."""

    prompts: list[str] | list[list[int]] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)


class LogProbsRequest(AdapterRequest):
    """Log-probs of ``completions`` given ``prompts`` (token ids), with ``top_k`` alternatives."""

    prompts: list[list[int]] = Field(min_length=1)
    completions: list[list[int]] = Field(min_length=1)
    top_k: int = Field(default=1, ge=0, le=20)


MAX_JOB_IDS = 256
"""Most job ids one request may list (duplicates are dropped, first occurrence kept)."""


def _distinct(ids: list[int]) -> list[int]:
    return list(dict.fromkeys(ids))


class SyncWeightsRequest(_Request):
    """Copy the training job's weights into sampling and log-prob jobs."""

    training_job_id: JobId
    sampling_job_ids: list[JobId] = Field(default_factory=list, max_length=MAX_JOB_IDS)
    log_prob_job_ids: list[JobId] = Field(default_factory=list, max_length=MAX_JOB_IDS)
    strategy: str = Field(
        default="drain",
        max_length=32,
        description="How targets swap weights while requests are in flight: 'drain' "
        "(finish in-flight requests first) or 'hotswap' (swap between decode steps; "
        "a completion then reports the weight versions it saw).",
    )
    adapter: str | None = _adapter_field(
        "LoRA jobs only: the adapter name the targets load the trainer's adapter under "
        "(default: training_adapter, else the default adapter); its version goes up by one."
    )
    training_adapter: str | None = _adapter_field(
        "LoRA jobs only: the training job's named adapter to send (default: the one it "
        "worked on last)."
    )

    _distinct_ids = field_validator("sampling_job_ids", "log_prob_job_ids")(_distinct)


class WeightNormRequest(_Request):
    """L2 norms of the weights of the given jobs."""

    job_ids: list[JobId] = Field(min_length=1, max_length=MAX_JOB_IDS)

    _distinct_ids = field_validator("job_ids")(_distinct)


class SleepRequest(JobRequest):
    """Release (sleep) or reclaim (wake) a job's device memory."""

    level: int = Field(default=1, ge=1, le=2)


class EmptyRequest(_Request):
    """An operation that takes no arguments."""


SESSION_ID_PATTERN = r"^[0-9a-f]{1,64}$"


class OpenSessionRequest(JobRequest):
    """Open an agent session on sampling job ``job_id``: turns older than ``max_staleness``
    weight versions are refused; it expires ``ttl`` seconds after its last use."""

    max_staleness: int | None = Field(default=None, ge=0)
    ttl: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)


class ListSessionsRequest(_Request):
    """List the open agent sessions (of sampling job ``job_id`` when given)."""

    job_id: JobId | None = None


class SessionRequest(_Request):
    """An operation on one agent session."""

    session_id: str = Field(min_length=1, max_length=64, pattern=SESSION_ID_PATTERN)


__all__ = [
    "ADAPTER_NAME_PATTERN",
    "CHECKPOINT_TAG_PATTERN",
    "JOB_TYPES",
    "MAX_JOB_IDS",
    "SESSION_ID_PATTERN",
    "AdapterRequest",
    "AddAdapterRequest",
    "BatchField",
    "EmptyRequest",
    "FwdBwdRequest",
    "FwdNoGradRequest",
    "GenerateRequest",
    "GetJobRequest",
    "InitializeRequest",
    "JobId",
    "JobRequest",
    "JobType",
    "ListSessionsRequest",
    "LoadCheckpointRequest",
    "LogProbsRequest",
    "OpenSessionRequest",
    "RemoveAdapterRequest",
    "SaveCheckpointRequest",
    "SessionRequest",
    "SleepRequest",
    "StepRequest",
    "SyncWeightsRequest",
    "TrainingAdapterRequest",
    "WeightNormRequest",
    "describe_errors",
]
