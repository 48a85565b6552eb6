"""The platform's own error types (each an ``ArcticRLError`` with its status and code)."""

from __future__ import annotations

from arctic_platform.rl.api import ArcticRLError, JobNotFoundError


class SubJobNotFoundError(JobNotFoundError):
    """A sub-job id that is not part of the job."""

    code = "sub_job_not_found"


class RequestNotFoundError(JobNotFoundError):
    """A request id that is not a request of the job."""

    code = "request_not_found"


class CheckpointNotFoundError(JobNotFoundError):
    """A checkpoint id the job does not have."""

    code = "checkpoint_not_found"


class JobExistsError(ArcticRLError):
    """A create with a client-chosen job id that this user already has (409)."""

    status = 409
    code = "job_exists"


class RolledBackRequestError(ArcticRLError):
    """A retried forward-backward whose effect a checkpoint load undid (409): send it anew."""

    status = 409
    code = "rolled_back"


class OverReservationError(ArcticRLError):
    """A create that would take the user past their GPU reservation (429)."""

    status = 429
    code = "over_reservation"


__all__ = [
    "CheckpointNotFoundError",
    "JobExistsError",
    "OverReservationError",
    "RequestNotFoundError",
    "RolledBackRequestError",
    "SubJobNotFoundError",
]
