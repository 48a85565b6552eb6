"""The platform's generic ``POST /{job_id}/operation``: forward, log-probs, weight sync and
norm, cache and memory calls, restart and request cancel, each inline or as a request record.
``PlatformService`` takes these methods from ``OperationsMixin``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from arctic_platform.rl.api import Batch, InvalidRequestError, JobStateError
from arctic_rl_dss.data_plane import b64_payload, validated
from arctic_rl_dss.errors import RequestNotFoundError
from arctic_rl_dss.models import WIRE_TO_CORE, OperationBody
from arctic_rl_dss.request_records import RequestRunner
from arctic_rl_dss.store import JobRow, Store, SubJobRow

logger = logging.getLogger(__name__)


class OperationsMixin:
    """The generic operations of ``PlatformService`` (its lookups and state are the service's)."""

    rl: Any
    store: Store
    requests: RequestRunner

    def operation(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        """A generic operation: async ones answer a request id, inline ones ``{"result"}``."""
        self._job(user, job_id)  # another user's job is a 404 before any check of the body
        handlers: dict[str, Callable[[str, str, OperationBody], dict[str, Any]]] = {
            "forward": self._op_forward,
            "log-probs": self._op_log_probs,
            "weight-sync": self._op_weight_sync,
            "weight-norm": self._op_weight_norm,
            "reset-prefix-cache": self._op_simple("reset_prefix_cache", None),
            "empty-training-cache": self._op_simple("empty_training_cache", "training"),
            "add-adapter": self._op_adapter("add_adapter", "training"),
            "remove-adapter": self._op_adapter("remove_adapter", None),
            "sleep": self._op_memory("sleep"),
            "wake": self._op_memory("wake"),
            "cancel-request": self._op_cancel_request,
            "restart": self._op_restart,
        }
        handler = handlers.get(body.operation_type)
        if handler is None:
            raise InvalidRequestError(
                f"unknown operation_type {body.operation_type!r}; known: {sorted(handlers)}"
            )
        return handler(user, job_id, body)

    def _target(
        self, user: str, job_id: str, body: OperationBody, job_type: str | None, what: str
    ) -> tuple[JobRow, SubJobRow]:
        wanted = WIRE_TO_CORE[body.sub_job_type] if body.sub_job_type else job_type
        job, sub = self._sub_job(
            user, job_id, sub_job_id=body.sub_job_id, job_type=wanted, operation=what
        )
        if body.sub_job_type and sub.job_type != WIRE_TO_CORE[body.sub_job_type]:
            raise InvalidRequestError(
                f"sub_job_id {sub.sub_job_id!r} and sub_job_type {body.sub_job_type!r} disagree"
            )
        self._running(job, sub)
        return job, sub

    def _op_forward(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        _job, sub = self._target(user, job_id, body, None, "forward")
        if sub.job_type == "sampling":
            raise InvalidRequestError("forward needs a training or log_probability sub-job")
        payload = b64_payload(body.payload)
        batch = Batch.build(payload.get("batch"))
        data = {
            "job_id": sub.engine_id,
            "batch": batch,
            "reference_model": bool(payload.get("reference_model", False)),
        }
        return self.requests.submit(
            user, job_id, "forward", lambda: self.rl.handle("fwd_no_grad", data)
        )

    def _op_log_probs(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        _job, sub = self._target(user, job_id, body, "log_prob", "log-probs")
        payload = dict(b64_payload(body.payload))
        payload["job_id"] = sub.engine_id
        from arctic_platform.rl.api import LogProbsRequest

        validated(LogProbsRequest, payload, "log-probs payload")
        return self.requests.submit(
            user, job_id, "log-probs", lambda: self.rl.handle("log_probs", payload)
        )

    def _op_weight_sync(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        payload = body.payload
        source = payload.get("source_sub_job_id") or body.sub_job_id
        job, trainer = self._sub_job(
            user, job_id, sub_job_id=source, job_type="training", operation="weight-sync"
        )
        self._running(job, trainer)
        subs = self.store.sub_jobs(user, job_id)
        targets_ids = payload.get("target_sub_job_ids")
        if targets_ids is None:
            targets = [s for s in subs if s.job_type in ("sampling", "log_prob")]
        else:
            if not isinstance(targets_ids, list) or not all(
                isinstance(t, str) for t in targets_ids
            ):
                raise InvalidRequestError("target_sub_job_ids must be a list of sub-job ids")
            targets = [self._sub_job(user, job_id, sub_job_id=t)[1] for t in targets_ids]
        if not targets or any(t.job_type == "training" for t in targets):
            raise InvalidRequestError("weight-sync targets sampling or log_probability sub-jobs")
        for target in targets:
            self._running(job, target)
        data = {
            "training_job_id": trainer.engine_id,
            "sampling_job_ids": [t.engine_id for t in targets if t.job_type == "sampling"],
            "log_prob_job_ids": [t.engine_id for t in targets if t.job_type == "log_prob"],
        }
        names = {str(t.engine_id): t.sub_job_id for t in targets}

        def run() -> Any:
            result = dict(self.rl.handle("sync_weights", data))
            result["jobs"] = {names.get(k, k): v for k, v in result.get("jobs", {}).items()}
            return result

        return self.requests.submit(user, job_id, "weight-sync", run)

    def _op_weight_norm(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        job = self._job(user, job_id)
        ids = body.payload.get("sub_job_ids")
        subs = self.store.sub_jobs(user, job_id)
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise InvalidRequestError("payload.sub_job_ids must be a list of sub-job ids")
            subs = [self._sub_job(user, job_id, sub_job_id=i)[1] for i in ids]
        for sub in subs:
            self._running(job, sub)
        answer = self.rl.handle("weight_norm", {"job_ids": [s.engine_id for s in subs]})
        by_engine = {str(s.engine_id): s.sub_job_id for s in subs}
        norms = {by_engine[k]: v for k, v in answer["norms"].items()}
        return {"result": {"norms": norms}}

    def _op_simple(
        self, name: str, job_type: str | None
    ) -> Callable[[str, str, OperationBody], dict[str, Any]]:
        def handler(user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
            _, sub = self._target(user, job_id, body, job_type, name)
            if name == "reset_prefix_cache" and sub.job_type == "training":
                raise InvalidRequestError("reset-prefix-cache is for sampling or log_probability")
            return {"result": self.rl.handle(name, {"job_id": sub.engine_id})}

        return handler

    def _op_adapter(
        self, name: str, job_type: str | None
    ) -> Callable[[str, str, OperationBody], dict[str, Any]]:
        """Add (training) or remove (any LoRA sub-job) the adapter the payload names."""

        def handler(user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
            _, sub = self._target(user, job_id, body, job_type, name)
            fields = ("adapter", "seed") if name == "add_adapter" else ("adapter",)
            payload = {k: body.payload[k] for k in fields if k in body.payload}
            return {"result": self.rl.handle(name, {"job_id": sub.engine_id, **payload})}

        return handler

    def _op_memory(self, verb: str) -> Callable[[str, str, OperationBody], dict[str, Any]]:
        names = {
            "training": f"{verb}_training",
            "sampling": f"{verb}_inference",
            "log_prob": f"{verb}_log_prob",
        }

        def handler(user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
            _, sub = self._target(user, job_id, body, None, verb)
            level = body.payload.get("level", 1)
            payload: dict[str, Any] = {"job_id": sub.engine_id, "level": level}
            return {"result": self.rl.handle(names[sub.job_type], payload)}

        return handler

    def _op_restart(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        """Start one sub-job again with the same id (core's ``restart_job``); answers inline.

        Training comes back from its latest checkpoint; poll the job until the sub-job runs.
        A cancelled job, or one lost with a platform restart, cannot be restarted.
        """
        if body.sub_job_id is None and body.sub_job_type is None:
            raise InvalidRequestError("restart needs sub_job_id (or sub_job_type)")
        wanted = WIRE_TO_CORE[body.sub_job_type] if body.sub_job_type else None
        job, sub = self._sub_job(
            user, job_id, sub_job_id=body.sub_job_id, job_type=wanted, operation="restart"
        )
        if job.cancelled:
            raise JobStateError(f"job {job_id!r} was cancelled; its sub-jobs cannot be restarted")
        if not self._live(job):
            why = job.lost_reason or "the platform server restarted"
            raise JobStateError(f"job {job_id!r} was lost ({why}); create a new job")
        self.rl.handle("restart_job", {"job_id": sub.engine_id})
        logger.info("user %s restarted sub-job %s", user, sub.sub_job_id)
        return {"result": self._sub_view(job, sub)}

    def _op_cancel_request(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        request_id = str(body.payload.get("request_id", ""))
        record = self.store.request(user, job_id, request_id)
        if record is None:
            raise RequestNotFoundError(f"job {job_id!r} has no request {request_id!r}")
        cancelled = record["status"] == "pending" and self.requests.cancel(request_id)
        status = self.store.request(user, job_id, request_id) or record
        return {
            "result": {"request_id": request_id, "cancelled": cancelled, "status": status["status"]}
        }


__all__ = ["OperationsMixin"]
