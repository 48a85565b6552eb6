"""``PlatformService``: the dss-platform protocol over our own ``RLServer`` (JobManager on Ray).

Transport-free: the FastAPI app in ``app.py`` authenticates, decodes bodies and calls these
methods with the calling user's name. Every lookup is scoped to that user, so another user's
job is indistinguishable from a job that does not exist (404). This module holds the control
plane (jobs, sub-jobs, capacity, metrics, checkpoints); the data plane is ``data_plane``, the
generic operations ``operations``, the request records ``request_records``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import InvalidRequestError, JobNotFoundError, JobStateError
from arctic_rl_dss.chunks import ChunkAssembler
from arctic_rl_dss.data_plane import DataPlaneMixin
from arctic_rl_dss.errors import (
    CheckpointNotFoundError,
    JobExistsError,
    OverReservationError,
    SubJobNotFoundError,
)
from arctic_rl_dss.models import (
    CORE_TO_WIRE,
    TERMINAL_JOB_STATES,
    WIRE_TO_CORE,
    CreateJobRequest,
    SubJobConfig,
)
from arctic_rl_dss.operations import OperationsMixin
from arctic_rl_dss.request_records import RequestRunner
from arctic_rl_dss.store import JobRow, Store, SubJobRow
from arctic_rl_dss.users import Users

logger = logging.getLogger(__name__)

_ORDER = {"pending": 0, "placing": 1, "initializing": 2, "running": 3}
_RESERVED_IDS = frozenset({"capacity", "health", "metrics", "docs", "redoc", "openapi.json"})
_JOB_ID_FIELDS = ("training_job_id", "sampling_job_id", "log_prob_job_id")


class PlatformService(DataPlaneMixin, OperationsMixin):
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
        self.requests = RequestRunner(store, workers)
        self._lock = threading.RLock()
        self._create_lock = threading.Lock()
        self.forward_backward_count: dict[int, int] = {}
        self._last_loss: dict[int, float] = {}

    def close(self) -> None:
        """Stop taking requests; queued ones are cancelled, running ones finish or fail."""
        self.requests.close()

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
                self.requests.cancel(record["request_id"])
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
    # Which checkpoints a training sub-job has (path and step) is core's catalog (get_job);
    # the store only notes what core does not know (loss, type, creation time), by path.

    def _catalog(self, sub: SubJobRow) -> list[dict[str, Any]]:
        """Core's checkpoints of a training sub-job, ``[{"step", "path"}]`` (existing only)."""
        return list(self._engine(sub).get("checkpoints") or [])

    def _checkpoints(self, user: str, job_id: str) -> list[dict[str, Any]]:
        """The job's checkpoints (core's catalog of each training sub-job, with the store's
        notes), oldest first; ``path`` included."""
        self._job(user, job_id)
        notes = self.store.checkpoint_notes(user, job_id)
        rows = []
        for sub in self.store.sub_jobs(user, job_id):
            if sub.job_type != "training":
                continue
            for entry in self._catalog(sub):
                path = str(entry["path"])
                note = notes.get(path, {})
                rows.append(
                    {
                        "checkpoint_id": Path(path).name,
                        "sub_job_id": sub.sub_job_id,
                        "path": path,
                        "global_steps": int(entry["step"]),
                        "avg_loss": note.get("avg_loss"),
                        "checkpoint_type": note.get("checkpoint_type", "resumable"),
                        "created_at": note.get("created_at"),
                    }
                )
        rows.sort(key=lambda r: (r["created_at"] or 0.0, r["global_steps"]))
        return rows

    def _checkpoint(self, user: str, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        for row in self._checkpoints(user, job_id):
            if row["checkpoint_id"] == checkpoint_id:
                return row
        raise CheckpointNotFoundError(f"job {job_id!r} has no checkpoint {checkpoint_id!r}")

    def list_checkpoints(self, user: str, job_id: str) -> dict[str, Any]:
        """The job's checkpoints (those whose files still exist)."""
        rows = self._checkpoints(user, job_id)
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
        """Delete a checkpoint's files (core's catalog then no longer lists it) and its note."""
        row = self._checkpoint(user, job_id, checkpoint_id)
        path = Path(row["path"]).resolve()
        root = (Path(self.rl.run_dir) / "checkpoints").resolve()
        if root in path.parents and path.exists():
            shutil.rmtree(path)
        self.store.delete_checkpoint_note(user, job_id, row["path"])

    # --- request records ----------------------------------------------------------------

    def get_request(
        self, user: str, job_id: str, request_id: str, wait: float = 0.0
    ) -> dict[str, Any]:
        """A request record; once done its result is a base64 frame (``wire_format``).

        With ``wait`` > 0 an unfinished request is waited for up to that many seconds (at
        most ``MAX_POLL_WAIT``), so a poll answers as soon as the work ends.
        """
        self._job(user, job_id)
        return self.requests.view(user, job_id, request_id, wait)

    def list_requests(self, user: str, job_id: str) -> dict[str, Any]:
        """The job's request records (newest first), without results."""
        self._job(user, job_id)
        keep = ("request_id", "operation", "status", "created_at", "updated_at", "error_code")
        return {"requests": [{k: r[k] for k in keep} for r in self.store.requests(user, job_id)]}
