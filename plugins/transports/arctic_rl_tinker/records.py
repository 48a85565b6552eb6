"""What the Tinker front-end keeps per client name: a model (its training and sampling jobs),
a sampler (a sampling job and weight version), the GPUs behind each model, and the errors
for a session, id or sampler that is gone, unknown or stale."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from arctic_platform.rl.api import DEFAULT_ADAPTER, InvalidRequestError, NotFoundError
from arctic_rl_tinker.futures import Lane

SESSION_TTL = 120.0
"""Seconds without a heartbeat (the SDK beats every 10 s) after which a session's models go."""


class SessionGoneError(InvalidRequestError):
    """A session that finished or expired (the SDK stops its heartbeat on 410)."""

    status = 410
    code = "session_finished"
    remedy = "Create a new session (a session ends when its heartbeat stops)."


class UnknownIdError(NotFoundError, InvalidRequestError):
    """A session, model, sampler, request or ``tinker://`` path this server does not know."""

    remedy = "Use an id this server gave out (ids do not survive a restart)."


class StaleWeightsError(InvalidRequestError):
    """A sampler opened on weights that a newer ``save_weights_for_sampler`` replaced."""

    status = 409
    code = "stale_weights"
    remedy = "Open a new sampling client on the newest saved weights."


@dataclass
class Model:
    """A Tinker training model: our training job and the sampling job it syncs into (LoRA mode:
    its pool's two jobs, shared with the other models of that pool, as its own ``adapter``)."""

    model_id: str
    base_model: str
    lane: Lane
    session_id: str = ""
    lora_rank: int | None = None
    lora: dict[str, Any] | None = None
    """``training_config.lora`` of its jobs; None: full fine-tuning."""
    adapter: str = DEFAULT_ADAPTER
    """The adapter its weights sync into and its samplers serve (LoRA mode)."""
    training_job: int | None = None
    sampling_job: int | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    pool: Any = None
    """LoRA mode: the ``pools.Pool`` whose jobs it shares (its adapter is its own)."""

    def adapter_fields(self) -> dict[str, str]:
        """The ``adapter`` field of its training requests (none for a job of its own)."""
        return {} if self.pool is None else {"adapter": self.adapter}


@dataclass
class Sampler:
    """A sampling session: a sampling job and the weight (or adapter) version it was opened on."""

    sampler_id: str
    base_model: str
    job_id: int
    version: int
    model_path: str | None = None
    adapter: str | None = None
    """LoRA: the adapter served at ``version`` (``base``: none); None: a full-weight job."""


@dataclass(frozen=True)
class Gpus:
    """GPUs of the jobs behind each model (from ``serve --num-gpus``)."""

    training: int = 1
    sampling: int = 1
    colocate: bool = True

    @classmethod
    def from_total(cls, total: int) -> Gpus:
        """Half for training and half for sampling; one shared bundle below two GPUs."""
        if total < 2:
            return cls(1, 1, True)
        training = total // 2
        return cls(training, total - training, False)


__all__ = [
    "SESSION_TTL",
    "Gpus",
    "Model",
    "Sampler",
    "SessionGoneError",
    "StaleWeightsError",
    "UnknownIdError",
]
