"""Error types of Arctic RL: every failure a user can act on is one of these.

Each class carries ``status``, the HTTP status a transport answers with when the error
reaches it from a request (``500`` for anything that is the server's fault).
"""

from __future__ import annotations


class ArcticRLError(Exception):
    """Base class of every error Arctic RL raises on purpose."""

    status: int = 500
    code: str = "internal_error"


class PluginError(ArcticRLError):
    """A plugin could not be loaded, resolved or used."""


class UnknownPluginError(PluginError, ValueError):
    """A configured name matches no installed plugin of that kind."""

    status = 422
    code = "unknown_plugin"


class DuplicatePluginError(PluginError):
    """Two plugins register the same name for the same kind."""


class NotImplementedInThisVersion(ArcticRLError, NotImplementedError):
    """A registered component whose implementation has not been built yet."""

    status = 501
    code = "not_implemented"


class InvalidRequestError(ArcticRLError, ValueError):
    """A request whose content is wrong (bad shapes, bad values): the caller must change it."""

    status = 422
    code = "invalid_request"


class JobError(ArcticRLError):
    """A job failed, is in the wrong state, or does not exist."""

    status = 409
    code = "job_error"


class JobNotFoundError(JobError, KeyError):
    """No job has this id (ids are never reused)."""

    status = 404
    code = "job_not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "job not found"


class JobStateError(JobError):
    """The job exists but is not in a state that allows the operation."""

    status = 409
    code = "job_not_running"


class OperationTimeoutError(JobError, TimeoutError):
    """An engine call did not finish within its timeout."""

    status = 504
    code = "timeout"


class WorkerDiedError(JobError):
    """An engine worker process died; its job is now failed."""

    status = 409
    code = "worker_died"


class TransportError(ArcticRLError):
    """The client could not reach the server or got an unusable answer."""

    status = 502
    code = "transport_error"


class AuthError(ArcticRLError):
    """A missing or wrong bearer token."""

    status = 401
    code = "unauthorized"


class PayloadTooLargeError(ArcticRLError):
    """A request body or frame over the configured size limit."""

    status = 413
    code = "payload_too_large"


class ServerError(TransportError):
    """The server answered a request with an error status."""

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.code = code or "error"


class MissingDependencyError(PluginError, ImportError):
    """An optional package a configured feature needs is not installed (the message says which)."""

    status = 501
    code = "missing_dependency"


class EngineError(ArcticRLError):
    """An engine failed an operation, or was used after ``close()`` or while asleep."""

    status = 500
    code = "engine_error"


class LossConfigError(InvalidRequestError):
    """A ``loss_config`` with unknown keys, or values a loss does not accept."""

    status = 422
    code = "invalid_loss_config"


class EngineConfigError(EngineError, ValueError):
    """An engine setting (ds_config, training_config, dtype) that cannot be honoured here."""

    status = 422
    code = "invalid_engine_config"


class CheckpointError(EngineError):
    """A checkpoint that cannot be written, found or restored."""

    code = "checkpoint_error"


class CheckpointNotFoundError(CheckpointError):
    """No complete checkpoint where the caller pointed: the caller's error, not the server's."""

    status = 404
    code = "checkpoint_not_found"
