"""The table of server operations: path, request model, and whether a retry is safe.

The http transport builds its routes from this table and the client its calls, so the two
can never disagree on a name.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from arctic_platform.rl.wire import requests as wire


@dataclass(frozen=True)
class Operation:
    """One server operation: ``RLServer.<name>(request)`` at ``POST|GET /<path>``."""

    name: str
    path: str
    request: type[BaseModel]
    method: str = "POST"
    idempotent: bool = False
    frames: bool = False  # request/response carry tensors: sent as safetensors frames
    query: tuple[str, ...] = ()  # request fields also accepted as query parameters


OPERATIONS: tuple[Operation, ...] = (
    Operation("health", "/health", wire.EmptyRequest, "GET", idempotent=True),
    Operation("status", "/status", wire.EmptyRequest, "GET", idempotent=True),
    Operation("metrics", "/metrics", wire.EmptyRequest, "GET", idempotent=True),
    Operation(
        "get_job",
        "/job/{job_id}",
        wire.GetJobRequest,
        "GET",
        idempotent=True,
        query=("request_id",),
    ),
    Operation("initialize", "/initialize", wire.InitializeRequest),
    Operation("destroy", "/destroy", wire.JobRequest),
    Operation("restart_job", "/restart", wire.JobRequest, query=("job_id",)),
    Operation("fwd_bwd", "/fwd-bwd", wire.FwdBwdRequest, frames=True),
    Operation("fwd_no_grad", "/fwd-no-grad", wire.FwdNoGradRequest, idempotent=True, frames=True),
    Operation("step", "/step", wire.StepRequest),
    Operation("save_checkpoint", "/save-checkpoint", wire.SaveCheckpointRequest),
    Operation("load_checkpoint", "/load-checkpoint", wire.LoadCheckpointRequest),
    Operation("add_adapter", "/add-adapter", wire.AddAdapterRequest),
    Operation("remove_adapter", "/remove-adapter", wire.RemoveAdapterRequest),
    Operation("empty_training_cache", "/empty-training-cache", wire.JobRequest, idempotent=True),
    Operation("generate", "/generate", wire.GenerateRequest, frames=True),
    Operation("log_probs", "/log-probs", wire.LogProbsRequest, idempotent=True, frames=True),
    Operation("sync_weights", "/sync-weights", wire.SyncWeightsRequest),
    Operation("weight_norm", "/weight-norm", wire.WeightNormRequest, idempotent=True),
    Operation("sleep_inference", "/sleep-inference", wire.SleepRequest, idempotent=True),
    Operation("wake_inference", "/wake-inference", wire.SleepRequest, idempotent=True),
    Operation("sleep_training", "/sleep-training", wire.SleepRequest, idempotent=True),
    Operation("wake_training", "/wake-training", wire.SleepRequest, idempotent=True),
    Operation("sleep_log_prob", "/sleep-log-prob", wire.SleepRequest, idempotent=True),
    Operation("wake_log_prob", "/wake-log-prob", wire.SleepRequest, idempotent=True),
    Operation("reset_prefix_cache", "/reset-prefix-cache", wire.JobRequest, idempotent=True),
    Operation("open_session", "/sessions", wire.OpenSessionRequest),
    Operation(
        "list_sessions",
        "/sessions",
        wire.ListSessionsRequest,
        "GET",
        idempotent=True,
        query=("job_id",),
    ),
    Operation("close_session", "/sessions/{session_id}/close", wire.SessionRequest),
    Operation(
        "session_trajectory",
        "/sessions/{session_id}/trajectory",
        wire.SessionRequest,
        "GET",
        idempotent=True,
    ),
    Operation("shutdown", "/shutdown", wire.EmptyRequest),
)

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}

__all__ = ["BY_NAME", "OPERATIONS", "Operation"]
