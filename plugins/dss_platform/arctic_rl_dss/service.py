"""``PlatformService``: the dss-platform protocol over our own ``RLServer`` (JobManager on Ray).

Transport-free: the FastAPI app in ``app.py`` authenticates, decodes bodies and calls these
methods with the calling user's name. Every lookup is scoped to that user, so another user's
job is indistinguishable from a job that does not exist (404).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from arctic_platform.rl.api import (
    ArcticRLError,
    Batch,
    InvalidRequestError,
    JobNotFoundError,
    JobStateError,
    decode_frame,
    describe_errors,
    encode_frame,
)
from arctic_rl_dss.chunks import (
    ChunkAssembler,
    ChunkConflictError,
    ChunkError,
    is_chunk,
    open_chunk,
)
from arctic_rl_dss.models import (
    CORE_TO_WIRE,
    TERMINAL_JOB_STATES,
    WIRE_TO_CORE,
    CreateJobRequest,
    ForwardBackwardFrame,
    GenerateFrame,
    LoadBody,
    OperationBody,
    SaveBody,
    StepBody,
    SubJobConfig,
)
from arctic_rl_dss.store import JobRow, Store, SubJobRow
from arctic_rl_dss.users import Users

logger = logging.getLogger(__name__)

_ORDER = {"pending": 0, "placing": 1, "initializing": 2, "running": 3}
_RESERVED_IDS = frozenset({"capacity", "health", "metrics", "docs", "redoc", "openapi.json"})
_JOB_ID_FIELDS = ("training_job_id", "sampling_job_id", "log_prob_job_id")
_RESULT_CACHE = 256
FRAME_RESULT = "arctic-rl-frame"
MAX_POLL_WAIT = 10.0
"""The longest a poll may hold for its request to end (``?wait_s=``)."""


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


class OverReservationError(ArcticRLError):
    """A create that would take the user past their GPU reservation (429)."""

    status = 429
    code = "over_reservation"


def _validated(model: type[BaseModel], data: Any, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid {what}: {describe_errors(exc)}") from None


def frame_result(value: Any) -> dict[str, Any]:
    """A result carried as a base64 frame inside poll JSON (tensors, NaN-safe)."""
    return {
        "content_type": "application/octet-stream",
        "encoding": "base64",
        "wire_format": FRAME_RESULT,
        "payload_b64": base64.b64encode(encode_frame(value)).decode(),
    }


def _b64_payload(payload: dict[str, Any]) -> dict[str, Any]:
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


class PlatformService:
    """Jobs with typed sub-jobs, request records, chunked uploads, checkpoints; per user."""

    def __init__(
        self,
        rl: Any,
        store: Store,
        users: Users,
        *,
        workers: int = 8,
        chunk_ttl: float = 3600.0,
        max_held_bytes: int = 2 * 1024**3,
    ) -> None:
        self.rl = rl
        self.store = store
        self.users = users
        self.chunks = ChunkAssembler(ttl=chunk_ttl, max_held_bytes=max_held_bytes)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="platform-req")
        self._futures: dict[str, Future[Any]] = {}
        self._ended: dict[str, threading.Event] = {}
        self._results: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.RLock()
        self._create_lock = threading.Lock()
        self.forward_backward_count: dict[int, int] = {}
        self._last_loss: dict[int, float] = {}

    def close(self) -> None:
        """Stop taking requests; queued ones are cancelled, running ones finish or fail."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- lookups ------------------------------------------------------------------------

    def _job(self, user: str, job_id: str) -> JobRow:
        job = self.store.job(user, job_id)
        if job is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return job

    def _live(self, job: JobRow) -> bool:
        return job.boot == self.store.boot and job.lost_reason is None

    def _engine(self, sub: SubJobRow) -> dict[str, Any]:
        return dict(self.rl.handle("get_job", {"job_id": sub.engine_id}))

    def _sub_status(self, job: JobRow, sub: SubJobRow) -> tuple[str, str | None, dict[str, Any]]:
        if not self._live(job):
            return "failed", job.lost_reason or "the platform server restarted", {}
        info = self._engine(sub)
        state = info["state"]
        if job.cancelled and state in ("cancelled", "terminated"):
            state = "cancelled"
        reason = info.get("reason")
        if state == "failed" and reason:
            reason = reason.strip().splitlines()[-1] if len(reason) > 2000 else reason
        return state, reason, info

    def _sub_view(self, job: JobRow, sub: SubJobRow) -> dict[str, Any]:
        state, reason, info = self._sub_status(job, sub)
        return {
            "sub_job_id": sub.sub_job_id,
            "job_type": CORE_TO_WIRE[sub.job_type],
            "number": sub.number,
            "status": state,
            "reason": reason or "",
            "model_name": info.get("model_name"),
            "n_gpus": sub.n_gpus,
            "weight_version": info.get("weight_version", 0),
            "forward_backward_count": self.forward_backward_count.get(sub.number, 0),
            "created_at": info.get("created_at", job.created_at),
            "updated_at": info.get("updated_at", job.updated_at),
        }

    def _job_view(self, job: JobRow) -> dict[str, Any]:
        subs = [self._sub_view(job, s) for s in self.store.sub_jobs(job.owner, job.job_id)]
        states = [s["status"] for s in subs]
        reason = ""
        if not self._live(job) and not job.cancelled:
            status, reason = "failed", job.lost_reason or ""
        elif job.cancelled:
            status = "cancelled"
        elif any(s == "failed" for s in states):
            status = "failed"
            reason = "; ".join(f"{s['sub_job_id']}: {s['reason']}" for s in subs if s["reason"])
        elif all(s == "running" for s in states):
            status = "running"
        elif all(s in TERMINAL_JOB_STATES for s in states):
            status = "cancelled" if "cancelled" in states else "terminated"
        else:
            status = min((s for s in states if s in _ORDER), key=_ORDER.__getitem__)
        return {
            "job_id": job.job_id,
            "status": status,
            "reason": reason,
            "experiment_name": job.body.get("experiment_name"),
            "created_at": job.created_at,
            "updated_at": max([job.updated_at, *(s["updated_at"] for s in subs)]),
            "sub_jobs": subs,
        }

    def _sub_job(
        self,
        user: str,
        job_id: str,
        *,
        sub_job_id: str | None = None,
        job_type: str | None = None,
        operation: str = "this operation",
    ) -> tuple[JobRow, SubJobRow]:
        job = self._job(user, job_id)
        subs = self.store.sub_jobs(user, job_id)
        if sub_job_id is not None:
            found = [s for s in subs if s.sub_job_id == sub_job_id]
            if not found:
                raise SubJobNotFoundError(f"job {job_id!r} has no sub-job {sub_job_id!r}")
            sub = found[0]
            if job_type is not None and sub.job_type != job_type:
                raise InvalidRequestError(
                    f"{operation} needs a {CORE_TO_WIRE[job_type]} sub-job; {sub_job_id!r} is a "
                    f"{CORE_TO_WIRE[sub.job_type]} sub-job"
                )
            return job, sub
        found = [s for s in subs if job_type is None or s.job_type == job_type]
        if not found:
            raise InvalidRequestError(
                f"job {job_id!r} has no {CORE_TO_WIRE.get(job_type or '', 'matching')} sub-job "
                f"for {operation}"
            )
        return job, found[0]

    def _running(self, job: JobRow, sub: SubJobRow) -> None:
        state, reason, _ = self._sub_status(job, sub)
        if state != "running":
            why = f": {reason}" if reason else ""
            raise JobStateError(f"sub-job {sub.sub_job_id} is {state}, not running{why}")

    # --- control plane ------------------------------------------------------------------

    def _engine_config(self, sub: SubJobConfig) -> dict[str, Any]:
        core = WIRE_TO_CORE[sub.job_type]
        config = {k: v for k, v in sub.arctic_rl_config.items() if k not in _JOB_ID_FIELDS}
        if config.get("checkpoint_path"):  # a server path of the user's choosing: not here
            raise InvalidRequestError(
                "arctic_rl_config.checkpoint_path is not accepted by the platform: it keeps each "
                "job's checkpoints under its own root (save and load them by checkpoint_id)"
            )
        config["model_name"] = sub.model_name
        for job_type in ("training", "sampling", "log_prob"):
            config.setdefault(f"{job_type}_gpus", 0)
        config[f"{core}_gpus"] = sub.n_gpus
        if sub.training_config is not None:
            extra = {k: v for k, v in sub.training_config.items() if k != "n_gpus"}
            given = config.get("training_config") or {}
            if not isinstance(given, dict):
                raise InvalidRequestError("arctic_rl_config.training_config must be an object")
            if extra:
                config["training_config"] = {**given, **extra}
        if sub.inference_config is not None:
            unknown = set(sub.inference_config) - {"n_gpus", "max_seq_len"}
            if unknown:
                raise InvalidRequestError(
                    f"inference_config: unknown field(s) {sorted(unknown)}; engine settings go in "
                    "arctic_rl_config (e.g. vllm_config)"
                )
        return config

    def create_job(self, user: str, body: CreateJobRequest) -> dict[str, Any]:
        """Create a job and start placing its sub-jobs; never creates one twice for a job id."""
        job_id = body.job_id or uuid.uuid4().hex[:12]
        if job_id.lower() in _RESERVED_IDS:
            raise InvalidRequestError(f"job id {job_id!r} is reserved; choose another")
        total = int(self._cluster_gpus())
        for sub in body.sub_job_configs:
            if total and sub.n_gpus > total:
                raise InvalidRequestError(
                    f"a {sub.job_type} sub-job asks for {sub.n_gpus} GPUs; the platform has {total}"
                )
        configs = [(sub, self._engine_config(sub)) for sub in body.sub_job_configs]
        with self._create_lock:
            if self.store.job_exists(user, job_id):
                raise JobExistsError(f"you already have a job {job_id!r}")
            reservation = self._reserved(user)
            wanted = sum(sub.n_gpus for sub in body.sub_job_configs)
            if reservation is not None and self._in_use(user) + wanted > reservation:
                raise OverReservationError(
                    f"this job needs {wanted} GPUs; your reservation is {reservation} and "
                    f"{self._in_use(user)} are in use"
                )
            created: list[tuple[str, str, int, int]] = []
            index: dict[str, int] = {}
            try:
                for sub, config in configs:
                    core = WIRE_TO_CORE[sub.job_type]
                    answer = self.rl.handle("initialize", {"job_type": core, "config": config})
                    n = index.get(core, 0)
                    index[core] = n + 1
                    created.append(
                        (f"{job_id}:{core}:{n}", core, int(answer["job_id"]), sub.n_gpus)
                    )
            except BaseException:
                for _, _, engine_id, _ in created:
                    try:
                        self.rl.handle("destroy", {"job_id": engine_id})
                    except Exception as exc:
                        logger.warning("undoing engine job %s failed: %s", engine_id, exc)
                raise
            self.store.add_job(user, job_id, body.model_dump(mode="json"), created)
        logger.info("user %s created job %s (%d sub-jobs)", user, job_id, len(created))
        return self._job_view(self._job(user, job_id))

    def get_job(self, user: str, job_id: str) -> dict[str, Any]:
        """The job and its sub-jobs, with states."""
        return self._job_view(self._job(user, job_id))

    def list_jobs(
        self, user: str, status: str | None = None, sub_job: int | None = None
    ) -> dict[str, Any]:
        """The user's jobs, optionally only those in ``status`` or holding sub-job ``sub_job``."""
        jobs = self.store.jobs(user)
        if sub_job is not None:
            row = self.store.sub_job_by_number(user, sub_job)
            jobs = [j for j in jobs if row is not None and j.job_id == row.job_id]
        views = [self._job_view(j) for j in jobs]
        if status:
            views = [v for v in views if v["status"] == status.lower().removeprefix("job_state_")]
        return {"jobs": views}

    def _cluster_gpus(self) -> float:
        cluster = getattr(self.rl, "cluster", None)
        return float(cluster.resources.get("GPU", 0)) if cluster is not None else 0.0

    def _reserved(self, user: str) -> int | None:
        for u in self.users.users:
            if u.name == user:
                return u.reserved_gpus
        return None

    def _active_gpus(self, owner: str | None) -> int:
        used = 0
        for job in self.store.jobs(owner):
            if not self._live(job) or job.cancelled:
                continue
            for sub in self.store.sub_jobs(job.owner, job.job_id):
                state, _, _ = self._sub_status(job, sub)
                if state in ("placing", "initializing", "running"):
                    used += sub.n_gpus
        return used

    def _in_use(self, user: str) -> int:
        return self._active_gpus(user)

    def capacity(self, user: str) -> dict[str, Any]:
        """The user's reservation, their GPUs in use, and what they could still get."""
        total = int(self._cluster_gpus())
        reserved = self._reserved(user)
        mine = self._in_use(user)
        free = max(0, total - self._active_gpus(None))
        limit = free if reserved is None else min(free, max(0, reserved - mine))
        return {
            "has_reservation": reserved is not None,
            "reserved_gpus": reserved if reserved is not None else total,
            "in_use_gpus": mine,
            "available_gpus": limit,
        }

    def cancel(self, user: str, job_id: str) -> dict[str, Any]:
        """Cancel a job (idempotent); a job that already ended on its own is a 409."""
        job = self._job(user, job_id)
        if job.cancelled:
            return self._job_view(job)
        view = self._job_view(job)
        if view["status"] in ("failed", "terminated") and all(
            s["status"] in TERMINAL_JOB_STATES for s in view["sub_jobs"]
        ):
            raise JobStateError(f"job {job_id!r} is already {view['status']}; nothing to cancel")
        self.store.mark_cancelled(user, job_id)
        self.chunks.drop_job(user, job_id)
        if self._live(job):
            for sub in self.store.sub_jobs(user, job_id):
                self.rl.handle("destroy", {"job_id": sub.engine_id})
        for record in self.store.requests(user, job_id):
            if record["status"] == "pending":
                self._cancel_request(record["request_id"])
        return self._job_view(self._job(user, job_id))

    def metrics(self, user: str) -> dict[str, Any]:
        """The caller's own counts, shaped like the local server's ``/metrics``.

        ``requests``/``errors``/``seconds`` (submission to end) per data-plane operation of
        the caller's request records, and ``jobs_by_state``: the caller's sub-jobs per state.
        Other users' work is not counted, so nothing about it leaks.
        """
        requests: dict[str, int] = defaultdict(int)
        errors: dict[str, int] = defaultdict(int)
        seconds: dict[str, float] = defaultdict(float)
        states: dict[str, int] = defaultdict(int)
        for job in self.store.jobs(user):
            for record in self.store.requests(user, job.job_id):
                operation = str(record["operation"])
                requests[operation] += 1
                if record["status"] == "failed":
                    errors[operation] += 1
                if record["status"] in ("done", "failed"):
                    seconds[operation] += float(record["updated_at"]) - float(record["created_at"])
            for sub in self._job_view(job)["sub_jobs"]:
                states[sub["status"]] += 1
        return {
            "requests": dict(requests),
            "errors": dict(errors),
            "seconds": {k: round(v, 6) for k, v in seconds.items()},
            "jobs_by_state": dict(states),
        }

    # --- checkpoints --------------------------------------------------------------------

    def _checkpoint(self, user: str, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        self._job(user, job_id)
        for row in self.store.checkpoints(user, job_id):
            if row["checkpoint_id"] == checkpoint_id:
                return row
        raise CheckpointNotFoundError(f"job {job_id!r} has no checkpoint {checkpoint_id!r}")

    def list_checkpoints(self, user: str, job_id: str) -> dict[str, Any]:
        """The job's checkpoints (those whose files still exist)."""
        self._job(user, job_id)
        rows = [r for r in self.store.checkpoints(user, job_id) if Path(r["path"]).exists()]
        return {"checkpoints": [{k: v for k, v in r.items() if k != "path"} for r in rows]}

    def checkpoint_file(self, user: str, job_id: str, checkpoint_id: str, name: str) -> Path:
        """One file of a checkpoint, confined to the checkpoint's directory."""
        root = Path(self._checkpoint(user, job_id, checkpoint_id)["path"]).resolve()
        try:
            target = (root / name).resolve()
        except (OSError, ValueError):  # a NUL byte, a name too long for the file system
            target = root
        if root not in target.parents or not target.is_file():
            raise CheckpointNotFoundError(f"checkpoint {checkpoint_id!r} has no file {name!r}")
        return target

    def export_checkpoint(self, user: str, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        """Download links (on this server, same token) for every file of a checkpoint."""
        row = self._checkpoint(user, job_id, checkpoint_id)
        root = Path(row["path"])
        if not root.exists():
            raise CheckpointNotFoundError(f"checkpoint {checkpoint_id!r} has no files any more")
        files = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            files.append(
                {
                    "filename": rel,
                    "url": f"/{job_id}/checkpoints/{checkpoint_id}/files/{rel}",
                    "size_bytes": path.stat().st_size,
                }
            )
        return {"checkpoint_id": checkpoint_id, "files": files, "expires_at": None}

    def delete_checkpoint(self, user: str, job_id: str, checkpoint_id: str) -> None:
        """Delete a checkpoint's files and its record."""
        row = self._checkpoint(user, job_id, checkpoint_id)
        path = Path(row["path"]).resolve()
        root = (Path(self.rl.run_dir) / "checkpoints").resolve()
        if root in path.parents and path.exists():
            shutil.rmtree(path)
        self.store.delete_checkpoint(user, job_id, checkpoint_id)

    # --- request records ----------------------------------------------------------------

    def _submit(
        self,
        user: str,
        job_id: str,
        operation: str,
        run: Callable[[], Any],
        key: str | None = None,
        fingerprint: str | None = None,
    ) -> dict[str, Any]:
        request_id, replayed = self.store.add_request(user, job_id, operation, key, fingerprint)
        if not replayed:
            with self._lock:
                self._ended[request_id] = threading.Event()
                self._futures[request_id] = self._pool.submit(self._execute, request_id, run)
        return {"request_id": request_id, "job_id": job_id, "replayed": replayed}

    def _execute(self, request_id: str, run: Callable[[], Any]) -> None:
        try:
            self._run_request(request_id, run)
        finally:
            with self._lock:
                ended = self._ended.pop(request_id, None)
            if ended is not None:
                ended.set()

    def _run_request(self, request_id: str, run: Callable[[], Any]) -> None:
        self.store.set_request(request_id, "running")
        try:
            result = run()
        except ArcticRLError as exc:
            status = getattr(exc, "status_code", None) or exc.status
            self.store.set_request(
                request_id, "failed", error=str(exc), error_code=exc.code, error_status=status
            )
            return
        except Exception as exc:
            logger.exception("request %s failed", request_id)
            self.store.set_request(
                request_id,
                "failed",
                error=f"{type(exc).__name__}: {exc}",
                error_code="internal_error",
                error_status=500,
            )
            return
        finally:
            with self._lock:
                self._futures.pop(request_id, None)
        try:
            path = self.store.result_path(request_id)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(encode_frame(result))
            os.replace(tmp, path)
        except Exception as exc:  # the result stays in memory; a restart would lose it
            logger.warning("cannot keep the result of request %s on disk: %s", request_id, exc)
        with self._lock:
            self._results[request_id] = result
            while len(self._results) > _RESULT_CACHE:
                self._results.popitem(last=False)
        self.store.set_request(request_id, "done", has_result=1)

    def _cancel_request(self, request_id: str) -> bool:
        with self._lock:
            future = self._futures.get(request_id)
        if future is not None and future.cancel():
            self.store.set_request(
                request_id, "cancelled", error="cancelled before it ran", error_code="cancelled"
            )
            with self._lock:
                ended = self._ended.pop(request_id, None)
            if ended is not None:
                ended.set()
            return True
        return False

    def _result(self, request_id: str) -> Any:
        with self._lock:
            if request_id in self._results:
                return self._results[request_id]
        path = self.store.result_path(request_id)
        if not path.exists():
            raise ArcticRLError(f"the result of request {request_id} is no longer kept")
        return decode_frame(path.read_bytes())

    def get_request(
        self, user: str, job_id: str, request_id: str, wait: float = 0.0
    ) -> dict[str, Any]:
        """A request record; once done its result is a base64 frame (``wire_format``).

        With ``wait`` > 0 an unfinished request is waited for up to that many seconds (at
        most ``MAX_POLL_WAIT``), so a poll answers as soon as the work ends.
        """
        self._job(user, job_id)
        record = self.store.request(user, job_id, request_id)
        if record is None:
            raise RequestNotFoundError(f"job {job_id!r} has no request {request_id!r}")
        if wait > 0 and record["status"] in ("pending", "running"):
            with self._lock:
                ended = self._ended.get(request_id)
            if ended is not None and ended.wait(min(wait, MAX_POLL_WAIT)):
                record = self.store.request(user, job_id, request_id) or record
        view = {k: record[k] for k in ("request_id", "job_id", "operation", "status")}
        view.update(created_at=record["created_at"], updated_at=record["updated_at"])
        view.update(result=None, error=record["error"] or "")
        view.update(error_code=record["error_code"], error_status=record["error_status"])
        if record["status"] == "done" and record["has_result"]:
            view["result"] = frame_result(self._result(request_id))
        return view

    def list_requests(self, user: str, job_id: str) -> dict[str, Any]:
        """The job's request records (newest first), without results."""
        self._job(user, job_id)
        keep = ("request_id", "operation", "status", "created_at", "updated_at", "error_code")
        return {"requests": [{k: r[k] for k in keep} for r in self.store.requests(user, job_id)]}

    # --- data plane ---------------------------------------------------------------------

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

    def forward_backward(self, user: str, job_id: str, body: bytes) -> dict[str, Any]:
        """One chunk of a forward-backward upload; the last one schedules it (at most once)."""
        self._job(user, job_id)
        answer, payload, key, sha = self._assemble(
            user, job_id, body, "forward-backward", "fb", chunked_only=True
        )
        if answer is not None:
            return answer
        request = _validated(ForwardBackwardFrame, payload, "forward-backward frame")
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

        return self._submit(user, job_id, "forward-backward", run, key, sha)

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

        return self._submit(user, job_id, "step", run, key)

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
            path = str(answer["path"])
            checkpoint_id = Path(path).name
            row = {
                "checkpoint_id": checkpoint_id,
                "sub_job_id": sub.sub_job_id,
                "path": path,
                "global_steps": int(answer["global_step"]),
                "avg_loss": self._last_loss.get(sub.number),
                "checkpoint_type": body.checkpoint_type,
                "created_at": time.time(),
            }
            self.store.add_checkpoint(user, job_id, row)
            return {
                "checkpoint_id": checkpoint_id,
                "checkpoint_path": path,
                "checkpoint_tag": checkpoint_id,
                "checkpoint_type": body.checkpoint_type,
                "global_steps": row["global_steps"],
                "path": path,
                "global_step": row["global_steps"],
            }

        return self._submit(user, job_id, "save", run)

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
        rows = [
            r for r in self.store.checkpoints(user, job_id) if r["sub_job_id"] == sub.sub_job_id
        ]
        if body.checkpoint_id is not None:
            row = self._checkpoint(user, job_id, body.checkpoint_id)
        elif body.step is not None:
            matches = [r for r in rows if r["global_steps"] == body.step]
            if not matches:
                steps = sorted({r["global_steps"] for r in rows})
                raise CheckpointNotFoundError(
                    f"job {job_id!r} has no checkpoint at step {body.step}; saved steps: {steps}"
                )
            row = matches[-1]
        elif rows:
            row = rows[-1]
        else:
            raise CheckpointNotFoundError(f"job {job_id!r} has no checkpoint yet")

        def run() -> Any:
            answer = self.rl.handle(
                "load_checkpoint", {"job_id": sub.engine_id, "path": row["path"]}
            )
            step = int(answer["global_step"])
            return {
                "checkpoint_id": row["checkpoint_id"],
                "global_steps": step,
                "global_step": step,
            }

        return self._submit(user, job_id, "load", run)

    def generate(self, user: str, job_id: str, body: bytes) -> dict[str, Any]:
        """Schedule generation from a frame (or the last chunk of a chunked one)."""
        self._job(user, job_id)
        answer, payload, key, sha = self._assemble(user, job_id, body, "generate", "gen")
        if answer is not None:
            return answer
        request = _validated(GenerateFrame, payload, "generate frame")
        job, sub = self._sub_job(
            user, job_id, sub_job_id=request.sub_job_id, job_type="sampling", operation="generate"
        )
        self._running(job, sub)
        data = {
            "job_id": sub.engine_id,
            "prompts": request.prompts,
            "sampling_params": request.sampling_params,
        }
        return self._submit(
            user, job_id, "generate", lambda: self.rl.handle("generate", data), key, sha
        )

    # --- generic operations -------------------------------------------------------------

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
        payload = _b64_payload(body.payload)
        batch = Batch.build(payload.get("batch"))
        data = {
            "job_id": sub.engine_id,
            "batch": batch,
            "reference_model": bool(payload.get("reference_model", False)),
        }
        return self._submit(user, job_id, "forward", lambda: self.rl.handle("fwd_no_grad", data))

    def _op_log_probs(self, user: str, job_id: str, body: OperationBody) -> dict[str, Any]:
        _job, sub = self._target(user, job_id, body, "log_prob", "log-probs")
        payload = dict(_b64_payload(body.payload))
        payload["job_id"] = sub.engine_id
        from arctic_platform.rl.api import LogProbsRequest

        _validated(LogProbsRequest, payload, "log-probs payload")
        return self._submit(user, job_id, "log-probs", lambda: self.rl.handle("log_probs", payload))

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

        return self._submit(user, job_id, "weight-sync", run)

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
        cancelled = record["status"] == "pending" and self._cancel_request(request_id)
        status = self.store.request(user, job_id, request_id) or record
        return {
            "result": {"request_id": request_id, "cancelled": cancelled, "status": status["status"]}
        }
