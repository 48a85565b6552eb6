"""``DssTransport``: each Arctic RL operation mapped onto the platform's control and data
planes, with request polling, chunked uploads and the protocol's retry rules.

The platform job is created at the first ``initialize`` (one job holding a sub-job for every
job type the config gives GPUs); later ``initialize`` calls return the ids of its other
sub-jobs. Sub-jobs are addressed by the integer numbers the platform hands out, so
``reconnect_config()`` works as with the local backend.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from arctic_platform.rl.api import (
    ClientTransport,
    OperationTimeoutError,
    ServerError,
    TransportError,
    decode_frame,
    encode_frame,
    http_common,
)
from arctic_rl_dss.chunks import DEFAULT_CHUNK_BYTES, encode_chunks
from arctic_rl_dss.models import CORE_TO_WIRE, TOKEN_TYPE, TOKEN_TYPE_HEADER, WIRE_TO_CORE

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({404, 409, 429, 500, 502, 503, 504})
"""Answers after which a safe call is tried again (the protocol's list) ..."""
DEFINITIVE_CODES = frozenset(
    {
        "job_not_found",
        "sub_job_not_found",
        "request_not_found",
        "checkpoint_not_found",
        "job_not_running",
        "job_error",
        "worker_died",
        "job_exists",
        "chunk_group_conflict",
        "chunk_group_restart_required",
        "rolled_back",
        "engine_error",
        "checkpoint_error",
        "internal_error",
        "timeout",
        "server_restarted",
    }
)
"""... unless the platform says the answer will not change (a 404 for a job that does not
exist, a 409 for a job that is not running, an engine's own failure)."""
IN_FLIGHT = frozenset({"pending", "running", "streaming"})


@dataclass
class PollSettings:
    """Request polling: first interval, growth factor, cap and overall limit (seconds)."""

    initial: float = 0.5
    factor: float = 1.25
    maximum: float = 6.0
    timeout: float = 1800.0


@dataclass(frozen=True)
class _SubJob:
    number: int
    job_id: str
    sub_job_id: str
    job_type: str  # Arctic RL's name: training, sampling, log_prob


def _decode_result(value: Any) -> Any:
    if isinstance(value, dict) and value.get("encoding") == "base64" and "payload_b64" in value:
        return decode_frame(base64.b64decode(value["payload_b64"]))
    return value


def _b64_frame(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "payload_b64": base64.b64encode(encode_frame(payload)).decode(),
        "content_type": "application/octet-stream",
    }


class DssTransport(ClientTransport):
    """Speaks the dss-platform protocol to ``host:port`` with a personal access token."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        *,
        poll: PollSettings | None = None,
        retries: int = 10,
        retry_backoff: float = 0.25,
        retry_cap: float = 4.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float = 300.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if not token:
            raise TransportError("DssTransport needs a personal access token")
        self.host, self.port = host, int(port)
        self.poll = poll or PollSettings()
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.retry_cap = retry_cap
        self.chunk_bytes = chunk_bytes
        self.base_url = http_common.base_url(host, self.port)
        self._client = http_common.http_client(
            self.base_url,
            {"Authorization": f"Bearer {token}", TOKEN_TYPE_HEADER: TOKEN_TYPE},
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
        self.job_id: str | None = None
        self.sub_jobs: dict[int, _SubJob] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"DssTransport({self.base_url})"

    # --- HTTP with the protocol's retry rules -------------------------------------------

    def _error(self, response: httpx.Response, what: str) -> ServerError:
        refused = f"the platform at {self.host}:{self.port} refused the token for {what}"
        return http_common.server_error(response, refused)

    def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        retry: bool = True,
        connect_only: bool = False,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """One request; retried on connection errors and the retry statuses when ``retry``.

        ``connect_only`` retries only failures to connect (the request surely never arrived).
        ``deadline`` (monotonic) keeps retrying connection errors until then, e.g. while a
        platform server restarts under a poll.
        """
        if self._closed:
            raise TransportError(f"{self!r} is closed")
        if "json" in kwargs:  # the shared JSON rule (NaN and inf kept), not httpx's
            kwargs["content"] = http_common.json_bytes(kwargs.pop("json"))
            kwargs["headers"] = {"Content-Type": http_common.JSON_CONTENT_TYPE}
        attempt = 0
        while True:
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                connect = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                more = attempt < self.retries or (
                    deadline is not None and time.monotonic() < deadline
                )
                if not retry or not more or (connect_only and not connect):
                    raise TransportError(
                        f"{what} ({method} {path}) to the platform at {self.host}:{self.port} "
                        f"failed after {attempt + 1} attempt(s): {type(exc).__name__}: {exc}"
                    ) from exc
            else:
                if response.is_success:
                    return http_common.answer_value(response, what)
                error = self._error(response, what)
                again = (
                    retry
                    and not connect_only
                    and response.status_code in RETRY_STATUSES
                    and error.code not in DEFINITIVE_CODES
                    and attempt < self.retries
                )
                if not again:
                    raise error
            delay = http_common.backoff_delay(
                attempt, self.retry_backoff, self.retry_cap, jitter=True
            )
            attempt += 1
            logger.debug("%s: retry %d in %.2fs", what, attempt, delay)
            time.sleep(delay)

    # --- requests -----------------------------------------------------------------------

    def wait_request(self, job_id: str, request_id: str, what: str) -> Any:
        """Poll a request record with backoff until it ends; its result, or the error it had."""
        settings = self.poll
        deadline = time.monotonic() + settings.timeout
        interval = settings.initial
        last_note = time.monotonic()
        status = "pending"
        while True:
            asked = time.monotonic()
            record = self._send(
                "GET",
                f"/{job_id}/requests/{request_id}",
                what=f"polling {what}",
                deadline=deadline,
                params={"wait_s": round(min(interval, max(0.0, deadline - asked)), 3)},
            )
            status = str(record.get("status", "")).lower().removeprefix("request_state_")
            if status in ("done", "completed", "succeeded"):
                return _decode_result(record.get("result"))
            if status in ("failed", "cancelled", "canceled"):
                raise ServerError(
                    int(record.get("error_status") or 500),
                    f"{what} failed on the platform (request {request_id}): "
                    f"{record.get('error') or status}",
                    record.get("error_code") or status,
                )
            if status not in IN_FLIGHT:
                raise TransportError(f"{what}: unknown request state {status!r}")
            now = time.monotonic()
            if now >= deadline:
                raise OperationTimeoutError(
                    f"{what} (request {request_id} of job {job_id}) was still {status} after "
                    f"{settings.timeout:.0f}s; it may still finish: poll "
                    f"GET /{job_id}/requests/{request_id}"
                )
            if now - last_note > 30:
                logger.info("%s: request %s still %s", what, request_id, status)
                last_note = now
            # A platform that held the poll (wait_s) already spent the interval; one that
            # answered at once is not polled faster than the backoff allows.
            time.sleep(max(0.0, min(interval - (now - asked), deadline - now)))
            interval = min(settings.maximum, interval * settings.factor)

    def _submitted(self, answer: Any, job_id: str, what: str) -> Any:
        if isinstance(answer, dict) and "request_id" in answer:
            return self.wait_request(job_id, str(answer["request_id"]), what)
        if isinstance(answer, dict) and "result" in answer:
            return answer["result"]
        raise TransportError(f"{what}: unexpected answer from the platform: {answer!r:.200}")

    def upload(self, job_id: str, path: str, frame: bytes, operation: str, group_id: str) -> Any:
        """POST ``frame`` as chunk envelopes of one group; the last answer (with request_id).

        Safe to retry (the group id is the idempotency key); a 409 asking for a restart
        sends the group again once from chunk 0.
        """
        chunks = encode_chunks(frame, operation, group_id, self.chunk_bytes)
        for restart in (False, True):
            try:
                answer = None
                for chunk in chunks:
                    answer = self._send(
                        "POST",
                        path,
                        what=f"{operation} chunk",
                        content=chunk,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                    if isinstance(answer, dict) and answer.get("replayed"):
                        return answer
                return answer
            except ServerError as exc:
                if exc.code != "chunk_group_restart_required" or restart:
                    raise
                logger.info("%s: the platform asked to resend group %s", operation, group_id)
        raise AssertionError("unreachable")

    # --- sub-jobs -----------------------------------------------------------------------

    def _remember(self, job: dict[str, Any]) -> None:
        for sub in job.get("sub_jobs", []):
            self.sub_jobs[int(sub["number"])] = _SubJob(
                int(sub["number"]), job["job_id"], sub["sub_job_id"], WIRE_TO_CORE[sub["job_type"]]
            )

    def _sub(self, number: int) -> _SubJob:
        number = int(number)
        if number not in self.sub_jobs:
            jobs = self._send("GET", "/", what="finding a sub-job", params={"sub_job": number})
            for job in jobs.get("jobs", []):
                self._remember(job)
        if number not in self.sub_jobs:
            raise ServerError(404, f"no job with id {number} on the platform", "job_not_found")
        return self.sub_jobs[number]

    def _view(self, job: dict[str, Any], sub: _SubJob) -> dict[str, Any]:
        for item in job.get("sub_jobs", []):
            if item["sub_job_id"] == sub.sub_job_id:
                return {
                    "job_id": sub.number,
                    "job_type": sub.job_type,
                    "state": item["status"],
                    "reason": item.get("reason") or None,
                    "sub_job_id": sub.sub_job_id,
                    "platform_job_id": sub.job_id,
                    "weight_version": item.get("weight_version", 0),
                    "forward_backward_count": item.get("forward_backward_count", 0),
                    "model_name": item.get("model_name"),
                    "num_gpus": item.get("n_gpus"),
                }
        raise ServerError(404, f"sub-job {sub.sub_job_id} is gone", "sub_job_not_found")

    def create_job(self, config: dict[str, Any]) -> dict[str, Any]:
        """Create the platform job for ``config`` once; never twice, even on lost answers."""
        subs = []
        for core in ("sampling", "log_prob", "training"):
            gpus = int(config.get(f"{core}_gpus") or 0)
            if gpus <= 0:
                continue
            key = "training_config" if core == "training" else "inference_config"
            subs.append(
                {
                    "job_type": CORE_TO_WIRE[core],
                    "model_name": config["model_name"],
                    key: {"n_gpus": gpus},
                    "arctic_rl_config": config,
                }
            )
        if not subs:
            raise TransportError("the config gives no job any GPUs; nothing to create")
        job_id = uuid.uuid4().hex[:16]
        body = {"sub_job_configs": subs, "job_id": job_id}
        try:
            job = self._send("POST", "/", what="create job", json=body, connect_only=True)
        except ServerError as exc:
            if exc.code == "job_exists":
                job = self._send("GET", f"/{job_id}", what="get job")
            elif exc.status_code >= 500:
                job = self._after_lost_create(job_id, body)
            else:
                raise
        except TransportError:
            job = self._after_lost_create(job_id, body)
        self.job_id = job["job_id"]
        self._remember(job)
        return job

    def _after_lost_create(self, job_id: str, body: dict[str, Any]) -> Any:
        """The create's answer was lost: look for the job before creating it (never blindly)."""
        logger.warning("create of job %s got no clear answer; checking whether it exists", job_id)
        try:
            return self._send("GET", f"/{job_id}", what="checking a create")
        except ServerError as exc:
            if exc.status_code != 404:
                raise
        try:  # the job id makes this safe: a duplicate is refused with 409 job_exists
            return self._send("POST", "/", what="create job", json=body, connect_only=True)
        except ServerError as exc:
            if exc.code != "job_exists":
                raise
            return self._send("GET", f"/{job_id}", what="get job")

    # --- the operations -----------------------------------------------------------------

    def call(self, operation: str, payload: dict[str, Any] | None = None) -> Any:
        """Invoke an Arctic RL operation through the platform API."""
        handler: Callable[[dict[str, Any]], Any] | None = getattr(self, f"_op_{operation}", None)
        if handler is None:
            raise TransportError(f"operation {operation!r} is not offered by the dss-platform")
        return handler(dict(payload or {}))

    def _op_health(self, _: dict[str, Any]) -> Any:
        return self._send("GET", "/health", what="health")

    def _op_status(self, _: dict[str, Any]) -> Any:
        jobs = self._send("GET", "/", what="list jobs")
        return {"jobs": jobs["jobs"], "capacity": self._send("GET", "/capacity", what="capacity")}

    def _op_initialize(self, payload: dict[str, Any]) -> Any:
        job_type = payload["job_type"]
        with self._lock:
            if self.job_id is None:
                self.create_job(payload["config"])
        for sub in self.sub_jobs.values():
            if sub.job_id == self.job_id and sub.job_type == job_type:
                return {"job_id": sub.number, "state": "pending"}
        raise TransportError(f"the platform job {self.job_id} has no {job_type} sub-job")

    def _op_metrics(self, _: dict[str, Any]) -> Any:
        return self._send("GET", "/metrics", what="metrics")

    def _op_restart_job(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        # not retried: a lost answer must not restart the sub-job a second time
        self._operation(sub, "restart", {}, retry=False)
        return self._view(self._send("GET", f"/{sub.job_id}", what="get job"), sub)

    def _op_shutdown(self, _: dict[str, Any]) -> Any:
        """Cancel the platform jobs this client holds; the platform itself serves on."""
        jobs = sorted({*(s.job_id for s in self.sub_jobs.values()), *filter(None, [self.job_id])})
        for job_id in jobs:
            try:
                self._send("POST", f"/{job_id}:cancel", what="cancel job")
            except ServerError as exc:
                if exc.status_code != 409:  # 409: it already ended on its own
                    raise
        return {"status": "shutting down", "cancelled_jobs": jobs}

    def _op_get_job(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        return self._view(self._send("GET", f"/{sub.job_id}", what="get job"), sub)

    def _op_destroy(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        try:
            job = self._send("POST", f"/{sub.job_id}:cancel", what="cancel job")
        except ServerError as exc:
            if exc.status_code != 409:
                raise
            job = self._send("GET", f"/{sub.job_id}", what="get job")
        return self._view(job, sub)

    def _op_fwd_bwd(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        frame = encode_frame(
            {
                "batch": payload["batch"],
                "loss_fn": payload.get("loss_fn", "grpo"),
                "loss_config": payload.get("loss_config"),
                "sub_job_id": sub.sub_job_id,
            }
        )
        group = str(payload.get("request_id") or uuid.uuid4().hex)
        path = f"/{sub.job_id}/forward-backward"
        answer = self.upload(sub.job_id, path, frame, "forward-backward", group)
        result = self._submitted(answer, sub.job_id, "forward-backward")
        metrics = dict(result.get("metrics") or result)
        if answer.get("replayed"):
            metrics["replayed"] = True
        return metrics

    def _op_step(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        body = {
            "learning_rate": payload.get("learning_rate"),
            "idempotency_key": payload.get("request_id"),
            "sub_job_id": sub.sub_job_id,
        }
        answer = self._send("POST", f"/{sub.job_id}/step", what="step", json=body)
        return self._submitted(answer, sub.job_id, "step")

    def _op_save_checkpoint(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        body = {"checkpoint_id": payload.get("tag"), "sub_job_id": sub.sub_job_id}
        answer = self._send("POST", f"/{sub.job_id}/save", what="save", json=body)
        return self._submitted(answer, sub.job_id, "save")

    def _op_load_checkpoint(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        body: dict[str, Any] = {"target_sub_job_id": sub.sub_job_id, "step": payload.get("step")}
        path = payload.get("path")
        if path:
            body["checkpoint_id"] = str(path).rstrip("/").rsplit("/", 1)[-1]
        answer = self._send("POST", f"/{sub.job_id}/load", what="load", json=body)
        return self._submitted(answer, sub.job_id, "load")

    def _op_generate(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        frame = encode_frame(
            {
                "prompts": payload["prompts"],
                "sampling_params": payload.get("sampling_params") or {},
                "sub_job_id": sub.sub_job_id,
            }
        )
        path = f"/{sub.job_id}/generate"
        if len(frame) <= self.chunk_bytes:
            answer = self._send(
                "POST",
                path,
                what="generate",
                content=frame,
                headers={"Content-Type": "application/octet-stream"},
            )
        else:
            answer = self.upload(sub.job_id, path, frame, "generate", uuid.uuid4().hex)
        return self._submitted(answer, sub.job_id, "generate")

    def _operation(
        self, sub: _SubJob, operation: str, payload: dict[str, Any], retry: bool = True
    ) -> Any:
        body = {"operation_type": operation, "sub_job_id": sub.sub_job_id, "payload": payload}
        answer = self._send(
            "POST", f"/{sub.job_id}/operation", what=operation, json=body, retry=retry
        )
        return self._submitted(answer, sub.job_id, operation)

    def _op_fwd_no_grad(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        frame = {
            "batch": payload["batch"],
            "reference_model": bool(payload.get("reference_model")),
        }
        return {"log_probs": self._operation(sub, "forward", _b64_frame(frame))["log_probs"]}

    def _op_log_probs(self, payload: dict[str, Any]) -> Any:
        sub = self._sub(payload["job_id"])
        keys: tuple[str, ...] = ("prompts", "completions", "top_k")
        frame = {k: payload[k] for k in keys if k in payload}
        return self._operation(sub, "log-probs", _b64_frame(frame))

    def _op_sync_weights(self, payload: dict[str, Any]) -> Any:
        trainer = self._sub(payload["training_job_id"])
        targets = [
            self._sub(n).sub_job_id
            for n in [*payload.get("sampling_job_ids", []), *payload.get("log_prob_job_ids", [])]
        ]
        body = {"source_sub_job_id": trainer.sub_job_id, "target_sub_job_ids": targets}
        return self._operation(trainer, "weight-sync", body)

    def _op_weight_norm(self, payload: dict[str, Any]) -> Any:
        subs = [self._sub(n) for n in payload["job_ids"]]
        if not subs:
            raise TransportError("weight_norm needs at least one job id")
        answer = self._operation(
            subs[0], "weight-norm", {"sub_job_ids": [s.sub_job_id for s in subs]}
        )
        by_id = {s.sub_job_id: s.number for s in subs}
        return {"norms": {str(by_id[k]): v for k, v in answer["norms"].items()}}

    def _simple(self, operation: str) -> Callable[[dict[str, Any]], Any]:
        def handler(payload: dict[str, Any]) -> Any:
            extra = {"level": payload["level"]} if "level" in payload else {}
            return self._operation(self._sub(payload["job_id"]), operation, extra)

        return handler

    def _op_reset_prefix_cache(self, payload: dict[str, Any]) -> Any:
        return self._simple("reset-prefix-cache")(payload)

    def _op_empty_training_cache(self, payload: dict[str, Any]) -> Any:
        return self._simple("empty-training-cache")(payload)

    def _op_add_adapter(self, payload: dict[str, Any]) -> Any:
        fields = {k: payload[k] for k in ("adapter", "seed") if k in payload}
        return self._operation(self._sub(payload["job_id"]), "add-adapter", fields)

    def _op_remove_adapter(self, payload: dict[str, Any]) -> Any:
        fields = {"adapter": payload["adapter"]}
        return self._operation(self._sub(payload["job_id"]), "remove-adapter", fields)

    def _sleep(self, payload: dict[str, Any]) -> Any:
        return self._simple("sleep")(payload)

    def _wake(self, payload: dict[str, Any]) -> Any:
        return self._simple("wake")(payload)

    # the platform's job knows its role: each role's sleep/wake is the one sleep/wake operation
    _op_sleep_inference = _op_sleep_training = _op_sleep_log_prob = _sleep
    _op_wake_inference = _op_wake_training = _op_wake_log_prob = _wake

    def close(self) -> None:
        """Close the connection pool (the platform's jobs keep running)."""
        self._closed = True
        self._client.close()

    def raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A bare request with this transport's headers (for tools and tests)."""
        return self._client.request(method, path, **kwargs)
