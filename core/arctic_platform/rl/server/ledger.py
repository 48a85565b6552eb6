"""The request-id ledger: which fwd_bwd/step request ids a training job applied, on which
step, with what result, and which of them a restore to a checkpoint undid.

A job keeps its ledger as ``Job.request_ids``; the durable job table stores it with the job.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from arctic_platform.rl.errors import RolledBackError

REQUEST_IDS_KEPT = 128
"""How many fwd_bwd/step request ids (with their results) the table keeps per job."""


class RequestIdRecord(BaseModel):
    """A fwd_bwd or step request id a training job applied, with the step it was applied on.

    ``key`` is ``fb:<id>`` or ``step:<id>``; ``base_step`` is the job's global step when the
    call ran (a step call makes ``base_step + 1``); ``rolled_back_to`` is set when the job was
    restored to a checkpoint at or before ``base_step``, which undid the call.
    """

    model_config = ConfigDict(extra="forbid")

    key: str
    base_step: int = Field(ge=0)
    result: dict[str, Any]
    rolled_back_to: int | None = None


def remember_request(
    records: list[RequestIdRecord],
    key: str,
    base_step: int,
    result: dict[str, Any],
    keep: int = REQUEST_IDS_KEPT,
) -> None:
    """Record ``key`` applied on ``base_step`` (replacing its older entry); keep ``keep``."""
    records[:] = [r for r in records if r.key != key]
    records.append(RequestIdRecord(key=key, base_step=base_step, result=dict(result)))
    del records[: max(0, len(records) - keep)]


def replay_request(
    records: list[RequestIdRecord], key: str, job_id: int, global_step: int
) -> dict[str, Any] | None:
    """The first result of request ``key``, or None when it is new and should be applied.

    A rolled-back id is applied again when the job is back on the step it first ran on (its
    effect no longer exists, so nothing is applied twice); anywhere else it is a
    ``RolledBackError`` naming the checkpoint step, so a late retry never lands silently on
    state it was not meant for.
    """
    found = next((r for r in records if r.key == key), None)
    if found is None:
        return None
    if found.rolled_back_to is None:
        return dict(found.result)
    if global_step == found.base_step:
        return None
    kind, _, request_id = key.partition(":")
    operation = "step" if kind == "step" else "fwd_bwd"
    raise RolledBackError(
        f"{operation} request {request_id!r} of job {job_id} was applied on step "
        f"{found.base_step}, which was rolled back when the job was restored to its checkpoint "
        f"at step {found.rolled_back_to}; the job is at step {global_step} now: go on from "
        "there (a repeat of this request is applied again once the job is back on step "
        f"{found.base_step})"
    )


def ledger_entry(records: list[RequestIdRecord], key: str) -> dict[str, Any] | None:
    """What the ledger holds for ``key``: the step it was applied on and, if a restore undid
    it, the checkpoint step (``rolled_back_to``); None when it holds no such id."""
    found = next((r for r in records if r.key == key), None)
    if found is None:
        return None
    return {"base_step": found.base_step, "rolled_back_to": found.rolled_back_to}


def roll_back_requests(records: list[RequestIdRecord], step: int) -> int:
    """Mark the ids applied on ``step`` or later as undone by a restore to ``step``; count."""
    undone = 0
    for record in records:
        if record.rolled_back_to is None and record.base_step >= step:
            record.rolled_back_to = step
            undone += 1
    return undone


__all__ = [
    "REQUEST_IDS_KEPT",
    "RequestIdRecord",
    "RolledBackError",
    "ledger_entry",
    "remember_request",
    "replay_request",
    "roll_back_requests",
]
