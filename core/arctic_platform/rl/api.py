"""The plugin API: the one module of core that a plugin imports.

Everything a backend, transport, engine or loss plugin needs from core is re-exported here:
the hook marker and spec types, the interfaces and protocols, the config models, the errors,
the wire models and operations table, the frame codec and batch checks, the metrics
recorder (``METRICS``, ``metrics_enabled``, ``record_http_bytes``), a few helpers, and
``http_common`` (the JSON, error and client plumbing the HTTP apps and clients share), and
the web kit (``serve_http``, the token rule, ``TokenGuard``/``GuardLayer``/``BodyLimit``,
``install_openapi``) that every HTTP front-end serves with, and the agent sessions'
OpenAI-compatible routes (``add_session_routes``, ``SessionHTTPServer``).
Core's own modules stay where they are; the rest of core is private to plugins
(``tests/unit/test_plugin_contract.py`` fails when a plugin imports anything else of it).

Importing this module does not import torch, ray, vllm, deepspeed or fastapi. The server-side
names (``RLServer`` and the Ray-cluster helpers) are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arctic_platform.rl import __version__, http_common
from arctic_platform.rl.agents.openai_api import SEED_MAX, SEED_MIN
from arctic_platform.rl.agents.openai_stream import sse_events
from arctic_platform.rl.batch import PER_TOKEN_FIELDS, Batch, BatchError, BatchLimits
from arctic_platform.rl.config import (
    DEFAULT_ADAPTER,
    LORA_RANKS,
    ArcticRLClientConfig,
    LoraConfig,
    MicroBatchSpec,
    OptimizerConfig,
    TrainingConfig,
    WeightSyncConfig,
)
from arctic_platform.rl.errors import (
    ArcticRLError,
    AuthError,
    BadRequestError,
    CheckpointError,
    CheckpointNotFoundError,
    DuplicatePluginError,
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    JobError,
    JobNotFoundError,
    JobStateError,
    LossConfigError,
    MissingDependencyError,
    NotFoundError,
    NotImplementedInThisVersion,
    OperationTimeoutError,
    PayloadTooLargeError,
    PluginError,
    RolledBackError,
    ServeError,
    ServerError,
    TransportError,
    UnknownPluginError,
    WorkerDiedError,
)
from arctic_platform.rl.interfaces import (
    Backend,
    ClientTransport,
    Engine,
    EngineContext,
    HostingServerTransport,
    LogProbEngine,
    LossFn,
    OperationHandler,
    SamplingEngine,
    ServerTransport,
    TrainingEngine,
)
from arctic_platform.rl.lazy_names import lazy_names
from arctic_platform.rl.loss_metrics import MISMATCH_METRICS, mismatch_extrema, mismatch_metrics
from arctic_platform.rl.losses import LossOutput, aggregate
from arctic_platform.rl.network import free_port, is_loopback, listening_socket
from arctic_platform.rl.observe import deferred_metrics
from arctic_platform.rl.observe.recorder import RECORDER as METRICS
from arctic_platform.rl.observe.recorder import metrics_enabled
from arctic_platform.rl.observe.server_metrics import record_http_bytes
from arctic_platform.rl.plugins import (
    ENGINE_ROLES,
    BackendSpec,
    EngineSpec,
    LossSpec,
    TrackerSpec,
    TransportSpec,
    get_registry,
    hookimpl,
    not_implemented_yet,
)
from arctic_platform.rl.plugins.specs import CommandSpec
from arctic_platform.rl.rollout_correction import PRESETS as ROLLOUT_CORRECTION_PRESETS
from arctic_platform.rl.rollout_correction import effective_sample_size
from arctic_platform.rl.run_dirs import (
    arctic_home,
    read_or_create_token,
    server_run_dir,
    write_private,
)
from arctic_platform.rl.sampled_batch import group_advantages, rollout_batch
from arctic_platform.rl.tracking import (
    RunTracker,
    Tracker,
    TrackerSettings,
    flatten_metrics,
    parse_report_to,
    safe_metric_name,
)
from arctic_platform.rl.web.byte_counter import ByteCounter
from arctic_platform.rl.web.guards import (
    BEARER_REFUSED,
    BodyLimit,
    GuardLayer,
    TokenGuard,
    bearer_token,
)
from arctic_platform.rl.web.openapi import install_openapi
from arctic_platform.rl.web.serve import (
    check_serve_token,
    serve_http,
    server_socket,
    stop_on_signals,
)
from arctic_platform.rl.web.session_routes import (
    SESSION_HEADER,
    SessionHTTPServer,
    add_session_routes,
    openai_error,
)
from arctic_platform.rl.weight_sync.strategy import check_strategy
from arctic_platform.rl.wire import (
    BY_NAME,
    FRAME_CONTENT_TYPE,
    OPERATIONS,
    EmptyRequest,
    FrameError,
    FwdBwdRequest,
    FwdNoGradRequest,
    GenerateRequest,
    InitializeRequest,
    JobRequest,
    LoadCheckpointRequest,
    LogProbsRequest,
    Operation,
    SaveCheckpointRequest,
    SleepRequest,
    StepRequest,
    SyncWeightsRequest,
    WeightNormRequest,
    decode_frame,
    describe_errors,
    encode_frame,
    validate_batch,
)

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.server.job_table import state_path
    from arctic_platform.rl.server.placement import WORKERS_PER_COLOCATED_BUNDLE
    from arctic_platform.rl.server.ray_cluster import (
        driver_node_address,
        is_loopback_address,
        prepare_ray,
        start_or_attach,
    )
    from arctic_platform.rl.server.rl_server import RLServer

_LAZY = {
    "RLServer": "arctic_platform.rl.server.rl_server",
    "state_path": "arctic_platform.rl.server.job_table",
    "WORKERS_PER_COLOCATED_BUNDLE": "arctic_platform.rl.server.placement",
    "driver_node_address": "arctic_platform.rl.server.ray_cluster",
    "is_loopback_address": "arctic_platform.rl.server.ray_cluster",
    "prepare_ray": "arctic_platform.rl.server.ray_cluster",
    "start_or_attach": "arctic_platform.rl.server.ray_cluster",
}

__all__ = [
    "BEARER_REFUSED",
    "BY_NAME",
    "DEFAULT_ADAPTER",
    "ENGINE_ROLES",
    "FRAME_CONTENT_TYPE",
    "LORA_RANKS",
    "METRICS",
    "MISMATCH_METRICS",
    "OPERATIONS",
    "PER_TOKEN_FIELDS",
    "ROLLOUT_CORRECTION_PRESETS",
    "SEED_MAX",
    "SEED_MIN",
    "SESSION_HEADER",
    "WORKERS_PER_COLOCATED_BUNDLE",
    "ArcticRLClientConfig",
    "ArcticRLError",
    "AuthError",
    "Backend",
    "BackendSpec",
    "BadRequestError",
    "Batch",
    "BatchError",
    "BatchLimits",
    "BodyLimit",
    "ByteCounter",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ClientTransport",
    "CommandSpec",
    "DuplicatePluginError",
    "EmptyRequest",
    "Engine",
    "EngineConfigError",
    "EngineContext",
    "EngineError",
    "EngineSpec",
    "FrameError",
    "FwdBwdRequest",
    "FwdNoGradRequest",
    "GenerateRequest",
    "GuardLayer",
    "HostingServerTransport",
    "InitializeRequest",
    "InvalidRequestError",
    "JobError",
    "JobNotFoundError",
    "JobRequest",
    "JobStateError",
    "LoadCheckpointRequest",
    "LogProbEngine",
    "LogProbsRequest",
    "LoraConfig",
    "LossConfigError",
    "LossFn",
    "LossOutput",
    "LossSpec",
    "MicroBatchSpec",
    "MissingDependencyError",
    "NotFoundError",
    "NotImplementedInThisVersion",
    "Operation",
    "OperationHandler",
    "OperationTimeoutError",
    "OptimizerConfig",
    "PayloadTooLargeError",
    "PluginError",
    "RLServer",
    "RolledBackError",
    "RunTracker",
    "SamplingEngine",
    "SaveCheckpointRequest",
    "ServeError",
    "ServerError",
    "ServerTransport",
    "SessionHTTPServer",
    "SleepRequest",
    "StepRequest",
    "SyncWeightsRequest",
    "TokenGuard",
    "Tracker",
    "TrackerSettings",
    "TrackerSpec",
    "TrainingConfig",
    "TrainingEngine",
    "TransportError",
    "TransportSpec",
    "UnknownPluginError",
    "WeightNormRequest",
    "WeightSyncConfig",
    "WorkerDiedError",
    "__version__",
    "add_session_routes",
    "aggregate",
    "arctic_home",
    "bearer_token",
    "check_serve_token",
    "check_strategy",
    "decode_frame",
    "deferred_metrics",
    "describe_errors",
    "driver_node_address",
    "effective_sample_size",
    "encode_frame",
    "flatten_metrics",
    "free_port",
    "get_registry",
    "group_advantages",
    "hookimpl",
    "http_common",
    "install_openapi",
    "is_loopback",
    "is_loopback_address",
    "listening_socket",
    "metrics_enabled",
    "mismatch_extrema",
    "mismatch_metrics",
    "not_implemented_yet",
    "openai_error",
    "parse_report_to",
    "prepare_ray",
    "read_or_create_token",
    "record_http_bytes",
    "rollout_batch",
    "safe_metric_name",
    "serve_http",
    "server_run_dir",
    "server_socket",
    "sse_events",
    "start_or_attach",
    "state_path",
    "stop_on_signals",
    "validate_batch",
    "write_private",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
