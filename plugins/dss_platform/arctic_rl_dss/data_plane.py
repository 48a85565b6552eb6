"""The platform's data plane: forward-backward, step, save, load and generate requests.

Each call checks its sub-job and body, then schedules the work as a request record
(``RequestRunner``); forward-backward and large generate frames arrive as chunk envelopes
whose group id is the idempotency key. ``PlatformService`` takes these methods from
``DataPlaneMixin``.
"""

from __future__ import annotations

import base64
import binascii
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from arctic_platform.rl.api import Batch, InvalidRequestError, decode_frame, describe_errors
from arctic_rl_dss.chunks import (
    ChunkAssembler,
    ChunkConflictError,
    ChunkError,
    is_chunk,
    open_chunk,
)
from arctic_rl_dss.errors import CheckpointNotFoundError, RolledBackRequestError
from arctic_rl_dss.models import ForwardBackwardFrame, GenerateFrame, LoadBody, SaveBody, StepBody
from arctic_rl_dss.request_records import RequestRunner
from arctic_rl_dss.store import Store


def validated(model: type[BaseModel], data: Any, what: str) -> Any:
    """``data`` as ``model``; a 422 naming ``what`` and the fields when it does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid {what}: {describe_errors(exc)}") from None


def b64_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """An operation payload, decoding a ``payload_b64`` frame when one is given."""
    if "payload_b64" not in payload:
        return payload
    try:
        data = base64.b64decode(payload["payload_b64"], validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"payload_b64 is not base64: {exc}") from None
    decoded = decode_frame(data)
    if not isinstance(decoded, dict):
        raise InvalidRequestError("the payload frame must hold an object of named fields")
    return decoded


class DataPlaneMixin:
    """The data-plane calls of ``PlatformService`` (its lookups and state are the service's)."""

    rl: Any
    store: Store
    chunks: ChunkAssembler
    requests: RequestRunner
    forward_backward_count: dict[int, int]
    _last_loss: dict[int, float]
    _lock: threading.RLock

    def _assemble(
        self,
        user: str,
        job_id: str,
        body: bytes,
        operation: str,
        key_prefix: str,
        chunked_only: bool = False,
    ) -> tuple[dict[str, Any] | None, Any, str | None, str | None]:
        """(answer to return now, or None; payload; idempotency key; frame SHA-256)."""
        decoded = decode_frame(body, as_lists=False)
        if not is_chunk(decoded):
            if chunked_only:
                raise ChunkError(
                    f"{operation} takes chunk envelopes (the group id is the idempotency key)"
                )
            return None, decode_frame(body), None, None
        header, data = open_chunk(decoded)
        if header.operation != operation:
            raise ChunkError(f"a chunk of a {header.operation!r} upload was sent to {operation!r}")
        key = f"{key_prefix}:{header.chunk_group_id}"
        existing = self.store.request_for_key(user, job_id, key)
        if existing is not None:  # a replayed chunk of a group that was already scheduled
            if existing[1] not in (None, header.frame_sha256):
                raise ChunkConflictError(
                    f"chunk group {header.chunk_group_id!r} was already used for another frame"
                )
            if operation == "forward-backward":
                self._check_not_rolled_back(user, job_id, existing[0], header.chunk_group_id)
            answer = {"request_id": existing[0], "job_id": job_id, "replayed": True}
            return answer, None, key, header.frame_sha256
        frame = self.chunks.add(user, job_id, header, data)
        if frame is None:
            received = self.chunks.pending(user, job_id, header.chunk_group_id) or 0
            answer = {
                "job_id": job_id,
                "chunk_group_id": header.chunk_group_id,
                "received_chunks": received,
                "total_chunks": header.total_chunks,
            }
            return answer, None, key, header.frame_sha256
        return None, decode_frame(frame), key, header.frame_sha256

    def _check_not_rolled_back(self, user: str, job_id: str, request_id: str, group: str) -> None:
        """409 when core's request-id ledger says a checkpoint load undid this applied
        forward-backward: its frame is gone, so only a new group can apply it again."""
        record = self.store.request(user, job_id, request_id)
        if record is None or record["status"] != "done":
            return  # still in flight, or it failed: the record answers
        for sub in self.store.sub_jobs(user, job_id):
            if sub.job_type != "training":
                continue
            info = self.rl.handle("get_job", {"job_id": sub.engine_id, "request_id": group[:128]})
            held = (info.get("request") or {}).get("fwd_bwd")
            if held is not None and held.get("rolled_back_to") is not None:
                raise RolledBackRequestError(
                    f"forward-backward chunk group {group!r} (request {request_id}) was applied "
                    f"on step {held['base_step']} of sub-job {sub.sub_job_id}; loading the "
                    f"checkpoint of step {held['rolled_back_to']} rolled its gradients back. "
                    "Send the batch again with a new chunk group id to apply it"
                )

    def forward_backward(self, user: str, job_id: str, body: bytes) -> dict[str, Any]:
        """One chunk of a forward-backward upload; the last one schedules it (at most once)."""
        self._job(user, job_id)
        answer, payload, key, sha = self._assemble(
            user, job_id, body, "forward-backward", "fb", chunked_only=True
        )
        if answer is not None:
            return answer
        request = validated(ForwardBackwardFrame, payload, "forward-backward frame")
        job, sub = self._sub_job(
            user, job_id, sub_job_id=request.sub_job_id, job_type="training",
            operation="forward-backward",
        )  # fmt: skip
        self._running(job, sub)
        batch = Batch.build(request.batch)  # the one build; the server checks the job's limits
        group = key.split(":", 1)[1] if key else None

        def run() -> Any:
            result = self.rl.handle(
                "fwd_bwd",
                {
                    "job_id": sub.engine_id,
                    "batch": batch,
                    "loss_fn": request.loss_fn,
                    "loss_config": request.loss_config,
                    "request_id": group[:128] if group else None,
                },
            )
            if not result.get("replayed"):
                with self._lock:
                    count = self.forward_backward_count.get(sub.number, 0)
                    self.forward_backward_count[sub.number] = count + 1
                if isinstance(result.get("loss"), int | float):
                    self._last_loss[sub.number] = float(result["loss"])
            return {"job_id": job_id, "avg_loss": result.get("loss"), "metrics": result, **result}

        return self.requests.submit(user, job_id, "forward-backward", run, key, sha)

    def step(self, user: str, job_id: str, body: StepBody) -> dict[str, Any]:
        """Schedule an optimizer step (once per ``idempotency_key``)."""
        job, sub = self._sub_job(
            user, job_id, sub_job_id=body.sub_job_id, job_type="training", operation="step"
        )
        self._running(job, sub)
        key = f"step:{body.idempotency_key}" if body.idempotency_key else None

        def run() -> Any:
            result = dict(
                self.rl.handle(
                    "step",
                    {
                        "job_id": sub.engine_id,
                        "learning_rate": body.learning_rate,
                        "request_id": body.idempotency_key,
                    },
                )
            )
            return {
                "global_steps": result.get("global_step"),
                "last_lr": result.get("lr"),
                **result,
            }

        # a retried key runs again: core's request-id ledger answers the first result, or
        # applies it again when a checkpoint load rolled it back
        return self.requests.submit(user, job_id, "step", run, key, rerun=True)

    def save(self, user: str, job_id: str, body: SaveBody) -> dict[str, Any]:
        """Schedule a checkpoint of the training sub-job."""
        job, sub = self._sub_job(
            user, job_id, sub_job_id=body.sub_job_id, job_type="training", operation="save"
        )
        self._running(job, sub)

        def run() -> Any:
            answer = self.rl.handle(
                "save_checkpoint", {"job_id": sub.engine_id, "tag": body.checkpoint_id}
            )
            path, step = str(answer["path"]), int(answer["global_step"])
            checkpoint_id = Path(path).name
            loss = self._last_loss.get(sub.number)
            self.store.add_checkpoint_note(user, job_id, path, loss, body.checkpoint_type)
            return {
                "checkpoint_id": checkpoint_id,
                "checkpoint_path": path,
                "checkpoint_tag": checkpoint_id,
                "checkpoint_type": body.checkpoint_type,
                "global_steps": step,
                "path": path,
                "global_step": step,
            }

        return self.requests.submit(user, job_id, "save", run)

    def load(self, user: str, job_id: str, body: LoadBody) -> dict[str, Any]:
        """Schedule loading a checkpoint of this job into its training sub-job."""
        self._job(user, job_id)  # another user's job is a 404 before any check of the body
        if body.source_job_id not in (None, job_id):
            raise InvalidRequestError(
                "source_job_id: loading another job's checkpoint is not offered by this platform"
            )
        job, sub = self._sub_job(
            user, job_id, sub_job_id=body.target_sub_job_id, job_type="training", operation="load"
        )
        self._running(job, sub)
        saved = self._catalog(sub)  # core's: {"step", "path"} of the checkpoints that exist
        request: dict[str, Any] = {"job_id": sub.engine_id}
        if body.checkpoint_id is not None:
            request["path"] = self._checkpoint(user, job_id, body.checkpoint_id)["path"]
        elif body.step is not None:
            if body.step not in {c["step"] for c in saved}:
                steps = sorted(c["step"] for c in saved)
                raise CheckpointNotFoundError(
                    f"job {job_id!r} has no checkpoint at step {body.step}; saved steps: {steps}"
                )
            request["step"] = body.step
        elif not saved:
            raise CheckpointNotFoundError(f"job {job_id!r} has no checkpoint yet")

        def run() -> Any:
            answer = self.rl.handle("load_checkpoint", request)  # neither: core's latest
            step = int(answer["global_step"])
            return {
                "checkpoint_id": Path(str(answer["path"])).name,
                "global_steps": step,
                "global_step": step,
            }

        return self.requests.submit(user, job_id, "load", run)

    def generate(self, user: str, job_id: str, body: bytes) -> dict[str, Any]:
        """Schedule generation from a frame (or the last chunk of a chunked one)."""
        self._job(user, job_id)
        answer, payload, key, sha = self._assemble(user, job_id, body, "generate", "gen")
        if answer is not None:
            return answer
        request = validated(GenerateFrame, payload, "generate frame")
        job, sub = self._sub_job(
            user, job_id, sub_job_id=request.sub_job_id, job_type="sampling", operation="generate"
        )
        self._running(job, sub)
        data = {
            "job_id": sub.engine_id,
            "prompts": request.prompts,
            "sampling_params": request.sampling_params,
        }
        return self.requests.submit(
            user, job_id, "generate", lambda: self.rl.handle("generate", data), key, sha
        )


__all__ = ["DataPlaneMixin", "b64_payload", "validated"]
