"""Pydantic models of the dss-platform protocol: create-job bodies, data-plane bodies, views.

Sub-job types on the wire are ``training``, ``sampling`` and ``log_probability``; the id
segment (and Arctic RL's job type) of the last one is ``log_prob``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

WireJobType = Literal["training", "sampling", "log_probability"]
WIRE_TO_CORE: dict[str, str] = {
    "training": "training",
    "sampling": "sampling",
    "log_probability": "log_prob",
}
CORE_TO_WIRE: dict[str, str] = {v: k for k, v in WIRE_TO_CORE.items()}

JOB_STATES = ("pending", "placing", "initializing", "running", "cancelled", "terminated", "failed")
TERMINAL_JOB_STATES = frozenset({"cancelled", "terminated", "failed"})
REQUEST_STATES = ("pending", "running", "done", "failed", "cancelled")
TERMINAL_REQUEST_STATES = frozenset({"done", "failed", "cancelled"})

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Client-chosen job and checkpoint ids: letters, digits, ``_ . -``; at most 64 characters."""

TOKEN_TYPE_HEADER = "X-Snowflake-Authorization-Token-Type"
TOKEN_TYPE = "PROGRAMMATIC_ACCESS_TOKEN"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubJobConfig(_Body):
    """One typed sub-job: ``training_config`` for training, ``inference_config`` otherwise.

    Each config holds ``n_gpus``; ``arctic_rl_config`` carries further Arctic RL client
    config fields (dtype, ds_config, vllm_config, colocate, ...) for the engines.
    """

    job_type: WireJobType
    model_name: str = Field(min_length=1)
    training_config: dict[str, Any] | None = None
    inference_config: dict[str, Any] | None = None
    arctic_rl_config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_config(self) -> SubJobConfig:
        wants = "training_config" if self.job_type == "training" else "inference_config"
        other = "inference_config" if wants == "training_config" else "training_config"
        config = getattr(self, wants)
        if config is None:
            raise ValueError(f"a {self.job_type} sub-job needs {wants}")
        if getattr(self, other) is not None:
            raise ValueError(f"a {self.job_type} sub-job takes {wants}, not {other}")
        gpus = config.get("n_gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"{wants}.n_gpus must be an integer >= 1, got {gpus!r}")
        return self

    @property
    def n_gpus(self) -> int:
        """GPUs this sub-job asks for."""
        config = self.training_config if self.job_type == "training" else self.inference_config
        assert config is not None
        return int(config["n_gpus"])


class CreateJobRequest(_Body):
    """``POST /``: one job with one or more sub-jobs; ``job_id`` lets the client name it."""

    sub_job_configs: list[SubJobConfig] = Field(min_length=1, max_length=8)
    job_id: str | None = Field(default=None, pattern=ID_PATTERN)
    experiment_name: str | None = Field(default=None, max_length=200)


class StepBody(_Body):
    """``POST /{job_id}/step``; ``idempotency_key`` makes a retried step apply once."""

    learning_rate: float | None = Field(default=None, gt=0)
    idempotency_key: str | None = Field(default=None, max_length=128)
    sub_job_id: str | None = None


class SaveBody(_Body):
    """``POST /{job_id}/save``: a checkpoint of the training sub-job, named ``checkpoint_id``."""

    checkpoint_id: str | None = Field(default=None, pattern=ID_PATTERN)
    checkpoint_type: Literal["resumable", "weights-only"] = "resumable"
    sub_job_id: str | None = None


class LoadBody(_Body):
    """``POST /{job_id}/load``: by ``checkpoint_id``, ``step`` or (neither) the latest."""

    checkpoint_id: str | None = None
    step: int | None = Field(default=None, ge=0)
    source_job_id: str | None = None
    target_sub_job_id: str | None = None


class OperationBody(_Body):
    """``POST /{job_id}/operation``: a generic operation routed to one sub-job."""

    operation_type: str = Field(min_length=1, max_length=64)
    sub_job_id: str | None = None
    sub_job_type: WireJobType | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class ForwardBackwardFrame(_Body):
    """What the forward-backward frame decodes to (a training batch and its loss)."""

    batch: dict[str, Any]
    loss_fn: str = "grpo"
    loss_config: dict[str, Any] | None = None
    sub_job_id: str | None = None


class GenerateFrame(_Body):
    """What the generate frame decodes to."""

    prompts: list[str] | list[list[int]] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    sub_job_id: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: a message a user can act on and a stable code."""

    message: str
    code: str


class SubmittedRequest(BaseModel):
    """The answer of a data-plane call: poll ``GET /{job_id}/requests/{request_id}``."""

    request_id: str
    job_id: str
    replayed: bool = False


class RequestView(BaseModel):
    """A request record: its state and, once done, its result (or error)."""

    request_id: str
    job_id: str
    operation: str
    status: str
    created_at: float
    updated_at: float
    result: Any = None
    error: str | None = None
    error_code: str | None = None
    error_status: int | None = None


class Capacity(BaseModel):
    """``GET /capacity`` for the calling user."""

    has_reservation: bool
    reserved_gpus: int
    in_use_gpus: int
    available_gpus: int
