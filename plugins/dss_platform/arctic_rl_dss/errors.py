"""The platform's own error types, each a subclass of a core ``ArcticRLError``.

A missing checkpoint and a rolled-back retry are core's ``CheckpointNotFoundError`` and
``RolledBackError`` (re-exported here under their old names), so ``except`` clauses catch
them the same whichever server raised them.
"""

from __future__ import annotations

from arctic_platform.rl.api import (
    ArcticRLError,
    CheckpointNotFoundError,
    JobError,
    JobNotFoundError,
    RolledBackError,
)

RolledBackRequestError = RolledBackError
"""Deprecated alias (kept one release): a retried request whose effect a load undid (409)."""


class SubJobNotFoundError(JobNotFoundError):
    """A sub-job id that is not part of the job."""

    code = "sub_job_not_found"
    remedy = "List the job's sub-jobs and name one of them."


class RequestNotFoundError(JobNotFoundError):
    """A request id that is not a request of the job."""

    code = "request_not_found"
    remedy = "Use the request id the job's submit answered with."


class JobExistsError(JobError):
    """A create with a client-chosen job id that this user already has (409)."""

    status = 409
    code = "job_exists"
    remedy = "Choose another job id, or use the existing job."


class OverReservationError(ArcticRLError):
    """A create that would take the user past their GPU reservation (429)."""

    status = 429
    code = "over_reservation"
    remedy = "Delete or finish one of your jobs first, or ask for a larger reservation."


__all__ = [
    "CheckpointNotFoundError",
    "JobExistsError",
    "OverReservationError",
    "RequestNotFoundError",
    "RolledBackRequestError",
    "SubJobNotFoundError",
]
