"""Error types of Arctic RL: every failure a user can act on is one of these.

Each class carries ``status``, the HTTP status a transport answers with when the error
reaches it from a request (``500`` for anything that is the server's fault), ``code``, the
machine-readable name in the error answer, and ``remedy``, what the caller should do. Each
``(status, code)`` pair is defined by one class only; a subclass either defines its own pair
or inherits its parent's. Core modules and plugins import their errors from here (or from
``arctic_platform.rl.api``); ``docs/errors.md`` is the table of them (``errors_doc``).
"""

from __future__ import annotations

from typing import ClassVar


class ArcticRLError(Exception):
    """An internal failure: the server's fault (also the base of every Arctic RL error)."""

    status: int = 500
    code: str = "internal_error"
    remedy: ClassVar[str] = "Retry once; if it fails again, report it with the server log."


# --- plugins and versions --------------------------------------------------------------------


class PluginError(ArcticRLError):
    """A plugin could not be loaded, resolved or used."""

    remedy = "Check the plugin's installation and the log line that names it."


class UnknownPluginError(PluginError, ValueError):
    """A configured name matches no installed plugin of that kind."""

    status = 422
    code = "unknown_plugin"
    remedy = "Use one of the names the message lists (`arctic-rl plugins` shows them)."


class DuplicatePluginError(PluginError):
    """Two plugins register the same name for the same kind."""

    remedy = "Uninstall or rename one of the two plugins."


class MissingDependencyError(PluginError, ImportError):
    """An optional package a configured feature needs is not installed (the message says which)."""

    status = 501
    code = "missing_dependency"
    remedy = "Install the package the message names, or do not configure that feature."


class NotImplementedInThisVersion(ArcticRLError, NotImplementedError):
    """A registered component whose implementation has not been built yet."""

    status = 501
    code = "not_implemented"
    remedy = "Use another component; this one is not available in this version."


# --- requests --------------------------------------------------------------------------------


class InvalidRequestError(ArcticRLError, ValueError):
    """A request whose content is wrong (bad shapes, bad values): the caller must change it."""

    status = 422
    code = "invalid_request"
    remedy = "Fix the request as the message says; sending it again unchanged fails again."


class BatchError(InvalidRequestError):
    """A training batch with missing fields, ragged shapes that disagree, or bad values."""

    remedy = "Fix the batch's fields or shapes as the message says."


class FrameError(InvalidRequestError):
    """A frame that cannot be decoded (corrupt, oversized or of an unknown layout)."""

    remedy = "Send the frame as the client library encodes it (`encode_frame`)."


class LossConfigError(InvalidRequestError):
    """A ``loss_config`` with unknown keys, or values a loss does not accept."""

    status = 422
    code = "invalid_loss_config"
    remedy = "Use only the keys and values the loss documents."


class BadRequestError(ArcticRLError):
    """A body that cannot be read: not JSON, or a ``Content-Length`` that is not a number."""

    status = 400
    code = "bad_request"
    remedy = "Send a well-formed body (JSON, or a frame with its content type)."


class UnsupportedMediaTypeError(ArcticRLError):
    """A body of a content type the server does not read."""

    status = 415
    code = "unsupported_media_type"
    remedy = "Send `application/json` or `application/octet-stream` (a frame)."


class PayloadTooLargeError(ArcticRLError):
    """A request body or frame over the configured size limit."""

    status = 413
    code = "payload_too_large"
    remedy = "Send smaller requests (split the batch), or raise the server's body limit."


class AuthError(ArcticRLError):
    """A missing or wrong bearer token."""

    status = 401
    code = "unauthorized"
    remedy = "Send the server's token (`Authorization: Bearer <token>`)."


class NotFoundError(ArcticRLError):
    """A resource (job, checkpoint, request, id) this server does not have."""

    status = 404
    code = "not_found"
    remedy = "Check the id; list what exists first."


# --- jobs ------------------------------------------------------------------------------------


class JobError(ArcticRLError):
    """A job failed, is in the wrong state, or does not exist."""

    status = 409
    code = "job_error"
    remedy = "Look at the job's status and log; create a new job if it failed."


class JobNotFoundError(JobError, NotFoundError, KeyError):
    """No job has this id (ids are never reused)."""

    status = 404
    code = "job_not_found"
    remedy = "Check the job id (list the jobs); a deleted job does not come back."

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "job not found"


class JobStateError(JobError):
    """The job exists but is not in a state that allows the operation."""

    status = 409
    code = "job_not_running"
    remedy = "Wait for the job to be running, or create a new one if it ended."


class RolledBackError(JobStateError):
    """A retried request id whose effect was undone when the job went back to a checkpoint."""

    code = "rolled_back"
    remedy = "Send the request again with a new request id."


class OperationTimeoutError(JobError, TimeoutError):
    """An engine call did not finish within its timeout."""

    status = 504
    code = "timeout"
    remedy = "Retry, or raise the timeout; a smaller batch finishes sooner."


class WorkerDiedError(JobError):
    """An engine worker process died; its job is now failed."""

    status = 409
    code = "worker_died"
    remedy = "Create a new job (from the last checkpoint); the server log says why it died."


class JobTableError(ArcticRLError):
    """The job table file is missing, unreadable or not a job table."""

    remedy = "Point `--resume` at a run directory this server wrote, or start afresh."


class JobLogError(JobTableError, ValueError):
    """A complete line of the job table's log that is not a change the server wrote."""

    remedy = "The run directory was edited or damaged; start afresh or restore it."


# --- engines and checkpoints -----------------------------------------------------------------


class EngineError(ArcticRLError):
    """An engine failed an operation, or was used after ``close()`` or while asleep."""

    status = 500
    code = "engine_error"
    remedy = "Look at the server log; create a new job if the engine is gone."


class EngineConfigError(EngineError, ValueError):
    """An engine setting (ds_config, training_config, dtype) that cannot be honoured here."""

    status = 422
    code = "invalid_engine_config"
    remedy = "Change the setting the message names."


class CheckpointError(EngineError):
    """A checkpoint that cannot be written, found or restored."""

    code = "checkpoint_error"
    remedy = "Check the checkpoint directory's disk space and permissions (server log)."


class CheckpointNotFoundError(CheckpointError, NotFoundError):
    """No complete checkpoint where the caller pointed: the caller's error, not the server's."""

    status = 404
    code = "checkpoint_not_found"
    remedy = "List the job's checkpoints and name one that exists (or save one first)."


# --- weight sync -----------------------------------------------------------------------------


class WeightSyncError(ArcticRLError):
    """A weight sync that failed; the receiver kept its previous weights."""

    status = 502
    code = "weight_sync_failed"
    remedy = "Retry the sync; the sampler still serves its previous weights."


class WeightMismatchError(WeightSyncError):
    """The sender's weights do not match what the receiver expects (name, shape or dtype)."""

    status = 422
    code = "weight_mismatch"
    remedy = "Sync between jobs of the same model (names, shapes and dtypes must agree)."


class StrayPeerError(WeightSyncError):
    """A message on a pair's store did not carry the sync's secret: not our peer."""

    remedy = "Another process uses the sync's ports: change `base_port`, or stop it."


class TopologyError(ArcticRLError, ValueError):
    """A weight-sync topology that cannot be scheduled."""

    status = 422
    code = "bad_topology"
    remedy = "Change the GPU counts or ports so every target has a sender and a port."


# --- clients and servers ---------------------------------------------------------------------


class TransportError(ArcticRLError):
    """The client could not reach the server or got an unusable answer."""

    status = 502
    code = "transport_error"
    remedy = "Check that the server runs at the configured address; retry."


class ServerError(TransportError):
    """The server answered a request with an error status; ``status`` is that status (one
    number with ``status_code``), not the 502 of a transport that got no answer."""

    remedy = "Act on the answer's status and code (this table)."

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status = status_code
        self.status_code = status_code
        self.message = message
        self.code = code or "error"


class ServeError(ArcticRLError):
    """A server refused to start (no token off loopback, bad token, the address is taken)."""

    remedy = "Fix what the message names (token, host, port) and start it again."


__all__ = [
    "ArcticRLError",
    "AuthError",
    "BadRequestError",
    "BatchError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DuplicatePluginError",
    "EngineConfigError",
    "EngineError",
    "FrameError",
    "InvalidRequestError",
    "JobError",
    "JobLogError",
    "JobNotFoundError",
    "JobStateError",
    "JobTableError",
    "LossConfigError",
    "MissingDependencyError",
    "NotFoundError",
    "NotImplementedInThisVersion",
    "OperationTimeoutError",
    "PayloadTooLargeError",
    "PluginError",
    "RolledBackError",
    "ServeError",
    "ServerError",
    "StrayPeerError",
    "TopologyError",
    "TransportError",
    "UnknownPluginError",
    "UnsupportedMediaTypeError",
    "WeightMismatchError",
    "WeightSyncError",
    "WorkerDiedError",
]
