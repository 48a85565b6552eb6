"""Jobs: groups of EngineWorker actors in placement groups, and their lifecycle.

States go ``pending → placing → initializing → running``; terminal states are ``failed``
(with a reason), ``cancelled`` and ``terminated``. Ids are integers and never reused.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import (
    ArcticRLError,
    InvalidRequestError,
    JobNotFoundError,
    JobStateError,
    OperationTimeoutError,
    WorkerDiedError,
)

logger = logging.getLogger(__name__)

COLOCATED_GPU_FRACTION = 0.3  # three roles share one bundle


class JobState(StrEnum):
    """Lifecycle state of a job."""

    PENDING = "pending"
    PLACING = "placing"
    INITIALIZING = "initializing"
    RUNNING = "running"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"

    @property
    def terminal(self) -> bool:
        return self in (JobState.FAILED, JobState.CANCELLED, JobState.TERMINATED)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int, low: int = 30000, high: int = 60000) -> int:
    """A base port with ``count`` consecutive ports free on 127.0.0.1 right now."""
    import random

    for _ in range(100):
        base = random.randint(low, high - count)
        try:
            for port in range(base, base + count):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports in {low}..{high}")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 20000 else text[:10000] + "\n...\n" + text[-10000:]


@dataclass
class Job:
    """One job: its config, state and workers."""

    job_id: int
    job_type: str
    engine: str
    config: dict[str, Any]
    num_gpus: int
    state: JobState = JobState.PENDING
    reason: str | None = None
    workers: list[Any] = field(default_factory=list)
    placement_group: Any = None
    owns_placement_group: bool = True
    weight_version: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    latest_checkpoint: str | None = None
    checkpoints: dict[int, str] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    cancel_requested: bool = False
    worker_pids: list[int] = field(default_factory=list)

    def set_state(self, state: JobState, reason: str | None = None) -> None:
        """Move to ``state`` (terminal states are final)."""
        if self.state.terminal:
            return
        self.state = state
        self.updated_at = time.time()
        if reason is not None:
            self.reason = reason
        logger.info(
            "job %d (%s): %s%s",
            self.job_id,
            self.job_type,
            state.value,
            f" ({reason.splitlines()[0]})" if reason else "",
        )

    def describe(self) -> dict[str, Any]:
        """The public view of this job (no tokens, no worker handles)."""
        return {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "engine": self.engine,
            "state": self.state.value,
            "reason": self.reason,
            "num_gpus": self.num_gpus,
            "workers": len(self.workers),
            "worker_pids": list(self.worker_pids),
            "weight_version": self.weight_version,
            "model_name": self.config.get("model_name"),
            "colocate": bool(self.config.get("colocate")),
            "latest_checkpoint": self.latest_checkpoint,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


class JobManager:
    """Creates jobs on Ray asynchronously and tracks their state."""

    def __init__(self, run_dir: Path, op_timeout: float = 900.0) -> None:
        self.run_dir = run_dir
        self.op_timeout = op_timeout
        self.jobs: dict[int, Job] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self._colocation_group: Any = None
        self._colocation_bundles = 0
        self._threads: list[threading.Thread] = []

    # --- lookup -------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with ``job_id``; JobNotFoundError if there is none."""
        job = self.jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        return job

    def running(self, job_id: int, job_type: str | None = None) -> Job:
        """The job, checked to be running (and of ``job_type``); else JobStateError."""
        job = self.get(job_id)
        if job_type is not None and job.job_type != job_type:
            raise JobStateError(
                f"job {job_id} is a {job.job_type} job, this operation needs a {job_type} job"
            )
        if job.state is not JobState.RUNNING:
            why = f": {job.reason.strip().splitlines()[-1]}" if job.reason else ""
            raise JobStateError(f"job {job_id} is {job.state.value}, not running{why}")
        return job

    # --- creation -----------------------------------------------------------------------

    def create(self, job_type: str, config: dict[str, Any]) -> Job:
        """Register a new job and start placing it in the background; returns at once."""
        from pydantic import ValidationError

        from arctic_platform.rl.config import ArcticRLClientConfig
        from arctic_platform.rl.plugins import get_registry

        try:
            parsed = ArcticRLClientConfig.model_validate(config)
        except ValidationError as exc:
            from arctic_platform.rl.wire import describe_errors

            raise InvalidRequestError(f"invalid config: {describe_errors(exc)}") from None
        engine = {
            "training": parsed.training_engine,
            "sampling": parsed.sampling_engine,
            "log_prob": parsed.log_prob_engine,
        }[job_type]
        spec = get_registry().get("engine", engine, role=job_type)
        if not spec.implemented:
            spec.create()  # raises NotImplementedInThisVersion with its message
        num_gpus = {
            "training": parsed.training_gpus,
            "sampling": parsed.sampling_gpus,
            "log_prob": parsed.log_prob_gpus,
        }[job_type]
        if num_gpus < 1:
            raise InvalidRequestError(
                f"the config gives the {job_type} job {num_gpus} GPUs "
                f"({job_type}_gpus); it needs at least 1"
            )
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
            job = Job(job_id, job_type, engine, parsed.model_dump(mode="json"), num_gpus)
            self.jobs[job_id] = job
        thread = threading.Thread(
            target=self._launch, args=(job,), daemon=True, name=f"launch-job-{job_id}"
        )
        self._threads.append(thread)
        thread.start()
        return job

    def _placement(self, job: Job) -> tuple[Any, list[float]]:
        """A placement group for ``job`` and the GPU fraction each of its workers asks for."""
        from ray.util.placement_group import placement_group

        if job.config.get("colocate"):
            with self._lock:
                need = max(
                    job.config.get("training_gpus", 0),
                    job.config.get("sampling_gpus", 0),
                    job.config.get("log_prob_gpus", 0),
                )
                if self._colocation_group is None:
                    bundles = [{"GPU": 1.0} for _ in range(need)]
                    self._colocation_group = placement_group(bundles, strategy="PACK")
                    self._colocation_bundles = need
                elif need > self._colocation_bundles:
                    raise InvalidRequestError(
                        f"colocated jobs share {self._colocation_bundles} GPU bundles; this "
                        f"config asks for {need}"
                    )
                job.owns_placement_group = False
                return self._colocation_group, [COLOCATED_GPU_FRACTION] * job.num_gpus
        bundles = [{"GPU": 1.0} for _ in range(job.num_gpus)]
        return placement_group(bundles, strategy="PACK"), [1.0] * job.num_gpus

    def _launch(self, job: Job) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from arctic_platform.rl.server.worker import EngineWorker

        timeout = float(job.config.get("job_ready_timeout", 600.0))
        deadline = time.monotonic() + timeout
        try:
            job.set_state(JobState.PLACING)
            pg, fractions = self._placement(job)
            job.placement_group = pg
            while not self._wait_ready(pg.ready(), 1.0):
                if job.cancel_requested:
                    return
                if time.monotonic() > deadline:
                    have = ray.available_resources().get("GPU", 0)
                    raise TimeoutError(
                        f"placing {job.num_gpus} GPU bundle(s) took longer than "
                        f"job_ready_timeout={timeout}s (cluster has {have} free GPUs)"
                    )
            if job.cancel_requested:
                return
            job.set_state(JobState.INITIALIZING)
            work_dir = self.run_dir / "jobs" / str(job.job_id)
            work_dir.mkdir(parents=True, exist_ok=True)
            master_port = free_port()
            remote_cls: Any = ray.remote(EngineWorker)
            workers = []
            for index, fraction in enumerate(fractions):
                env = {
                    "RANK": str(index),
                    "LOCAL_RANK": str(index),
                    "WORLD_SIZE": str(job.num_gpus if job.job_type == "training" else 1),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(master_port if job.job_type == "training" else free_port()),
                    "ARCTIC_RL_JOB_ID": str(job.job_id),
                }
                if job.job_type != "training":
                    env["RANK"], env["LOCAL_RANK"] = "0", "0"
                rank = index if job.job_type == "training" else 0
                world = job.num_gpus if job.job_type == "training" else 1
                worker = remote_cls.options(
                    num_cpus=0,
                    num_gpus=fraction,
                    max_concurrency=4,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=index
                    ),
                    name=None,
                ).remote(
                    job.job_type, job.engine, job.config, rank, world, index, str(work_dir), env
                )
                workers.append(worker)
            job.workers = workers
            refs = [w.setup.remote() for w in workers]
            pending = list(refs)
            while pending:
                if job.cancel_requested:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"engines of job {job.job_id} were not ready within "
                        f"job_ready_timeout={timeout}s"
                    )
                _, pending = ray.wait(
                    pending, num_returns=len(pending), timeout=min(1.0, remaining)
                )
            job.worker_pids = [int(info["pid"]) for info in ray.get(refs)]
            job.set_state(JobState.RUNNING)
        except Exception as exc:
            logger.debug("job %d failed: %s", job.job_id, traceback.format_exc())
            job.set_state(JobState.FAILED, reason=f"{type(exc).__name__}: {_reason(exc)}")
            self._release(job)

    @staticmethod
    def _wait_ready(ref: Any, timeout: float) -> bool:
        import ray

        ready, _ = ray.wait([ref], timeout=timeout)
        return bool(ready)

    # --- calls --------------------------------------------------------------------------

    def call(
        self, job: Job, worker_refs: list[Any], operation: str, timeout: float | None = None
    ) -> list[Any]:
        """Wait for ``worker_refs`` of ``job``; worker death fails the job, a timeout names it."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        limit = self.op_timeout if timeout is None else timeout
        try:
            return list(ray.get(worker_refs, timeout=limit))
        except GetTimeoutError:
            raise OperationTimeoutError(
                f"{operation} on job {job.job_id} ({job.job_type}) did not finish within {limit}s"
            ) from None
        except RayActorError as exc:
            reason = f"a worker of job {job.job_id} died during {operation}: {_reason(exc)}"
            job.set_state(JobState.FAILED, reason=reason)
            self._release(job)
            raise WorkerDiedError(reason) from None
        except RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, Exception) else None
            if isinstance(cause, ArcticRLError):
                raise cause from None
            if isinstance(cause, ValueError | TypeError | KeyError):
                raise InvalidRequestError(f"{operation} on job {job.job_id}: {cause}") from None
            raise

    def check_alive(self) -> None:
        """Ping every running job's workers; a dead worker turns its job ``failed``."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        for job in list(self.jobs.values()):
            if job.state is not JobState.RUNNING:
                continue
            try:
                ray.get([w.ping.remote() for w in job.workers], timeout=30)
            except RayActorError as exc:
                job.set_state(
                    JobState.FAILED, reason=f"a worker of job {job.job_id} died: {_reason(exc)}"
                )
                self._release(job)
            except GetTimeoutError:
                logger.warning("job %d: a worker did not answer a ping within 30 s", job.job_id)

    # --- teardown -----------------------------------------------------------------------

    def _release(self, job: Job) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in job.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:
                pass
        job.workers = []
        if job.placement_group is not None and job.owns_placement_group:
            try:
                remove_placement_group(job.placement_group)
            except Exception:
                pass
        job.placement_group = None

    def destroy(self, job_id: int) -> Job:
        """Stop a job: a job still being placed is ``cancelled``, a started one ``terminated``."""
        import ray

        job = self.get(job_id)
        with job.lock:
            if job.state.terminal:
                return job
            job.cancel_requested = True
            if job.state in (JobState.PENDING, JobState.PLACING):
                job.set_state(JobState.CANCELLED, reason="destroyed while waiting for GPUs")
            else:
                if job.workers:
                    try:
                        ray.get([w.close.remote() for w in job.workers], timeout=60)
                    except Exception as exc:
                        logger.warning("job %d: close failed: %s", job.job_id, exc)
                job.set_state(JobState.TERMINATED, reason="destroyed")
            self._release(job)
        return job

    def destroy_all(self) -> None:
        """Destroy every job that is not finished yet."""
        for job_id in list(self.jobs):
            try:
                self.destroy(job_id)
            except Exception as exc:
                logger.warning("destroying job %d failed: %s", job_id, exc)
        if self._colocation_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._colocation_group)
            except Exception:
                pass
            self._colocation_group = None
