"""What travels between client and server: request models (``requests``), the operation
table (``operations``) and the safetensors frame codec (``frames``).

``from arctic_platform.rl.wire import FwdBwdRequest`` keeps working: this package face
re-exports the request models of the former ``wire.py`` and the names of the other two.
"""

from arctic_platform.rl.wire.frames import (
    FRAME_CONTENT_TYPE,
    MAX_NESTING,
    FrameError,
    decode_frame,
    encode_frame,
    validate_batch,
)
from arctic_platform.rl.wire.operations import BY_NAME, OPERATIONS, Operation
from arctic_platform.rl.wire.requests import (
    CHECKPOINT_TAG_PATTERN,
    JOB_TYPES,
    MAX_JOB_IDS,
    BatchField,
    EmptyRequest,
    FwdBwdRequest,
    FwdNoGradRequest,
    GenerateRequest,
    GetJobRequest,
    InitializeRequest,
    JobId,
    JobRequest,
    JobType,
    LoadCheckpointRequest,
    LogProbsRequest,
    SaveCheckpointRequest,
    SleepRequest,
    StepRequest,
    SyncWeightsRequest,
    WeightNormRequest,
    describe_errors,
)

__all__ = [
    "BY_NAME",
    "CHECKPOINT_TAG_PATTERN",
    "FRAME_CONTENT_TYPE",
    "JOB_TYPES",
    "MAX_JOB_IDS",
    "MAX_NESTING",
    "OPERATIONS",
    "BatchField",
    "EmptyRequest",
    "FrameError",
    "FwdBwdRequest",
    "FwdNoGradRequest",
    "GenerateRequest",
    "GetJobRequest",
    "InitializeRequest",
    "JobId",
    "JobRequest",
    "JobType",
    "LoadCheckpointRequest",
    "LogProbsRequest",
    "Operation",
    "SaveCheckpointRequest",
    "SleepRequest",
    "StepRequest",
    "SyncWeightsRequest",
    "WeightNormRequest",
    "decode_frame",
    "describe_errors",
    "encode_frame",
    "validate_batch",
]
