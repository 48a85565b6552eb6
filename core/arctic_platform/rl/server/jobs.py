"""Jobs: groups of EngineWorker actors in placement groups, and their lifecycle.

States (``job_state.JobState``) go ``pending → placing → initializing → running``; terminal
states are ``failed`` (with a reason), ``cancelled`` and ``terminated``. Ids are integers
and never reused, also across a server restart: every change is written to the durable job
table (``job_table``), from which a restarted server brings its jobs back. ``Job`` and
``JobState`` live in ``job_state``; ``free_port`` in ``network`` (both re-exported here, the
old home, for one release).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import (
    ArcticRLError,
    EngineError,
    InvalidRequestError,
    JobNotFoundError,
    JobStateError,
    OperationTimeoutError,
    WorkerDiedError,
)
from arctic_platform.rl.network import free_port
from arctic_platform.rl.server.job_faults import (
    dead_nodes,
    failure_node,
    failure_reason,
    lost_nodes,
)
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.job_table import JobJournal, JobTable, load_table
from arctic_platform.rl.server.placement import (
    Placement,
    check_cluster_has,
    check_colocated_room,
)
from arctic_platform.rl.server.worker_launch import engine_spec, start_workers

__all__ = ["Job", "JobManager", "JobState", "free_port"]

logger = logging.getLogger(__name__)


class JobManager:
    """Creates jobs on Ray asynchronously and tracks their state."""

    def __init__(
        self,
        run_dir: Path,
        op_timeout: float = 900.0,
        server_settings: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.op_timeout = op_timeout
        self.server_settings = dict(server_settings or {})
        self.jobs: dict[int, Job] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self._table_lock = threading.Lock()
        self._journal = JobJournal(run_dir)
        self._placement = Placement(self._lock)
        self._threads: list[threading.Thread] = []
        self._frozen = False  # set when the server stops: the table keeps the jobs' states
        self._worker_seconds: dict[str, float] = {}
        self._worker_seconds_lock = threading.Lock()

    # --- the durable job table ------------------------------------------------------------

    def persist(self, job: Job | None = None) -> None:
        """Make ``job``'s change durable (one log line), or with no job rewrite the whole
        table (a snapshot); the table is compacted when the log is full. Never raises."""
        with self._table_lock:
            if self._frozen:
                return
            try:
                if job is not None and self._journal.append(job.record(), self._next_id):
                    return
                self._compact()
            except Exception as exc:  # a full disk must not take the server down
                logger.error("could not write the job table in %s: %s", self.run_dir, exc)

    def _compact(self) -> None:
        """Write every job and the next id as a fresh snapshot and empty the log (under the
        table lock)."""
        table = JobTable(
            next_job_id=self._next_id,
            server=self.server_settings,
            jobs=[job.record() for job in list(self.jobs.values())],
        )
        self._journal.compact(table)

    def load_previous(self, resume: bool) -> list[Job]:
        """Take over the jobs of an earlier server with this run dir, with the same ids.

        With ``resume`` the jobs that were not finished start again in the background
        (training from its latest checkpoint); without it they turn ``failed`` with a reason
        saying how to bring them back. Failed, cancelled and terminated jobs stay so. Returns
        the jobs being restarted.
        """
        table = load_table(self.run_dir)
        if table is None:
            return []
        restarted = []
        with self._lock:
            self._next_id = max(
                [table.next_job_id, self._next_id, *(r.job_id + 1 for r in table.jobs)]
            )
            for record in table.jobs:
                job = Job.from_record(record)
                job.listener = self.persist
                self.jobs[job.job_id] = job
                if job.state.terminal:
                    continue
                if resume:
                    restarted.append(job)
                else:
                    job.state = JobState.FAILED
                    job.reason = (
                        "the server was restarted without --resume; restart_job (POST /restart) "
                        "or `arctic-rl serve --resume RUN_DIR` brings this job back"
                    )
        for job in restarted:
            self._relaunch(job, why="the server was resumed")
        self.persist()
        if table.jobs:
            logger.info(
                "job table %s: %d job(s), %d restarting; next job id %d",
                self.run_dir,
                len(table.jobs),
                len(restarted),
                self._next_id,
            )
        return restarted

    def restart(self, job_id: int) -> Job:
        """Start a failed (or running) job again with the same id; returns at once.

        Training starts from its latest checkpoint; sampling and log-prob from the newest
        weights they can load (see ``_relaunch``). A destroyed job cannot be restarted.
        """
        job = self.get(job_id)
        with job.lock:
            if job.state in (JobState.CANCELLED, JobState.TERMINATED):
                raise JobStateError(
                    f"job {job_id} was {job.state.value} ({job.reason}); it cannot be restarted, "
                    "create a new job instead"
                )
            if job.state not in (JobState.FAILED, JobState.RUNNING):
                raise JobStateError(
                    f"job {job_id} is {job.state.value}; only a failed or running job can be "
                    "restarted"
                )
            self._release(job)
            job.restarts += 1
            self._relaunch(job, why="restart requested")
        return job

    def _relaunch(self, job: Job, why: str) -> None:
        """Reset ``job`` to pending and launch it from the best state it has."""
        job.state = JobState.PENDING
        job.reason = None
        job.cancel_requested = False
        job.worker_pids = []
        job.nodes = []
        job.updated_at = time.time()
        job.launch_overrides = self._restore_source(job)
        logger.info(
            "job %d (%s): starting again (%s) from %s",
            job.job_id,
            job.job_type,
            why,
            job.weights_from or "its config",
        )
        job.changed()
        self._start_thread(job)

    def _restore_source(self, job: Job) -> dict[str, Any]:
        """Config fields that make ``job`` start from its newest saved state; sets weights_from.

        Training: its latest checkpoint. Sampling/log-prob: the Hugging Face export inside the
        latest checkpoint of the training job it was last synced from, else its own model.
        The weight version only stays put when the job is back on the weights it started with.
        """
        if job.job_type == "training":
            # the engine resolves the path: a save cut short between its renames leaves the
            # complete copy hidden; a checkpoint gone for good fails the job with that reason
            if job.latest_checkpoint:
                job.weights_from = f"checkpoint {job.latest_checkpoint}"
                return {"checkpoint_path": job.latest_checkpoint}
            job.weights_from = "its config (no checkpoint was saved)"
            job.global_step = 0
            return {}
        trainer = self.jobs.get(job.synced_from) if job.synced_from is not None else None
        checkpoint = trainer.latest_checkpoint if trainer is not None else None
        # the training engine says where its checkpoints keep a Hugging Face export, if any
        export_dir = (
            engine_spec(trainer.engine, "training").hf_export_dir if trainer is not None else None
        )
        export = Path(checkpoint) / export_dir if checkpoint and export_dir else None
        if export is not None and (export / "config.json").is_file():
            job.weight_version += 1
            job.weights_from = (
                f"checkpoint {checkpoint} of training job {trainer.job_id if trainer else '?'}"
            )
            return {"model_name": str(export)}
        if job.weight_version > 0:
            job.weight_version += 1
            job.weights_from = "model_name (the synced weights were lost; sync again)"
        else:
            job.weights_from = "model_name"
        return {}

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

    def create(
        self, job_type: str, config: dict[str, Any], *, colocation_group: str | None = None
    ) -> Job:
        """Register a new job and start placing it in the background; returns at once.
        ``colocation_group`` (colocated jobs only) names the shared bundles it joins."""
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
        if colocation_group is not None and not parsed.colocate:
            raise InvalidRequestError(
                f"colocation_group {colocation_group!r} names shared GPU bundles, which only "
                "colocated jobs use; set colocate=true in the config or leave it out"
            )
        check_cluster_has(job_type, parsed)
        with self._lock:
            if parsed.colocate:
                holders = [j.num_gpus for j in self._live_colocated(colocation_group)]
                check_colocated_room(num_gpus, holders)
            job_id = self._next_id
            self._next_id += 1
            job = Job(job_id, job_type, engine, parsed.model_dump(mode="json"), num_gpus)
            job.colocation_group = colocation_group
            job.weights_from = "model_name" if job_type != "training" else None
            job.listener = self.persist
            self.jobs[job_id] = job
        self.persist()
        self._start_thread(job)
        return job

    def _start_thread(self, job: Job) -> None:
        thread = threading.Thread(
            target=self._launch, args=(job,), daemon=True, name=f"launch-job-{job.job_id}"
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _launch(self, job: Job) -> None:
        try:
            start_workers(job, self._placement.for_job, self.run_dir, self.op_timeout)
        except Exception as exc:
            logger.debug("job %d failed: %s", job.job_id, traceback.format_exc())
            job.set_state(JobState.FAILED, reason=f"{type(exc).__name__}: {failure_reason(exc)}")
            self._release(job)
            return
        with job.lock:
            # Destroyed while being placed: ``destroy`` released what the job held then, but
            # the placement group it was waiting for may have been created after that (the
            # race left a GPU bundle reserved for good). Free whatever start_workers got.
            if job.cancel_requested:
                self._release(job)

    # --- calls --------------------------------------------------------------------------

    def call(
        self, job: Job, worker_refs: list[Any], operation: str, timeout: float | None = None
    ) -> list[Any]:
        """Wait for ``worker_refs`` of ``job``; worker death fails the job, a timeout names it."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        limit = self.op_timeout if timeout is None else timeout
        workers = job.workers  # the generation of workers these refs went to
        started = time.monotonic()
        try:
            results = list(ray.get(worker_refs, timeout=limit))
            self._count_worker_seconds(operation, time.monotonic() - started)
            return results
        except GetTimeoutError:
            raise OperationTimeoutError(
                f"{operation} on job {job.job_id} ({job.job_type}) did not finish within {limit}s"
            ) from None
        except RayActorError as exc:
            where = failure_node(job, workers, exc)
            why = failure_reason(exc)
            reason = f"a worker of job {job.job_id}{where} died during {operation}: {why}"
            self._worker_died(job, workers, reason)
            raise WorkerDiedError(reason) from None
        except RayTaskError as exc:
            # Only a deliberate refusal (an ArcticRLError below 500, e.g. InvalidRequestError)
            # is the caller's fault; anything else an engine raised is the server's: a 500
            # naming the job and operation, its traceback in the job's log.
            cause = exc.cause if isinstance(exc.cause, Exception) else None
            if isinstance(cause, ArcticRLError) and cause.status < 500:
                raise cause from None
            log = self._log_failure(job, operation, exc)
            where = f"{operation} on job {job.job_id} ({job.job_type})"
            if isinstance(cause, ArcticRLError):
                if f"job {job.job_id}" not in str(cause) and len(cause.args) == 1:
                    cause.args = (f"{where}: {cause}",)
                raise cause from None
            what = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            raise EngineError(f"{where} failed: {what} (traceback in {log})") from None

    def _count_worker_seconds(self, operation: str, seconds: float) -> None:
        with self._worker_seconds_lock:
            self._worker_seconds[operation] = self._worker_seconds.get(operation, 0.0) + seconds

    def worker_seconds(self) -> dict[str, float]:
        """Seconds spent waiting for workers per engine method, summed over successful calls.

        The refs are sent right before the wait, so this is the workers' time plus Ray's hop;
        an operation's total in ``metrics`` minus this is what the server and transport add.
        """
        with self._worker_seconds_lock:
            return dict(self._worker_seconds)

    def _log_failure(self, job: Job, operation: str, exc: BaseException) -> Path:
        """Append an engine failure's (remote) traceback to the job's log; returns its path."""
        log = self.run_dir / "jobs" / str(job.job_id) / "job.log"
        text = "".join(traceback.format_exception(exc))
        logger.error("%s on job %d failed; traceback in %s\n%s", operation, job.job_id, log, text)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                f.write(f"--- {stamp} {operation} failed\n{text}\n")
        except OSError as err:  # pragma: no cover - the server log still has it
            logger.warning("could not write %s: %s", log, err)
        return log

    def check_alive(self) -> None:
        """Fail every running job with a worker on a node Ray reports dead (killed or cut
        off), then ping the rest; a dead worker turns its job ``failed``."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        gone = dead_nodes()
        for job in list(self.jobs.values()):
            if job.state is not JobState.RUNNING:
                continue
            workers = job.workers
            lost = lost_nodes(job, gone)
            if lost:
                self._worker_died(job, workers, f"job {job.job_id} lost {lost}")
                continue
            try:
                ray.get([w.ping.remote() for w in workers], timeout=30)
            except RayActorError as exc:
                where = failure_node(job, workers, exc)
                reason = f"a worker of job {job.job_id}{where} died: {failure_reason(exc)}"
                self._worker_died(job, workers, reason)
            except GetTimeoutError:
                logger.warning("job %d: a worker did not answer a ping within 30 s", job.job_id)

    def _worker_died(self, job: Job, workers: list[Any], reason: str) -> None:
        """Fail ``job`` for a dead worker, unless it was restarted since (new workers); the
        reason names the node when Ray reports it dead."""
        if job.state is JobState.RUNNING and job.workers is workers:
            lost = lost_nodes(job, dead_nodes())
            if lost and "lost node" not in reason:
                reason = f"{reason} (job {job.job_id} lost {lost})"
            job.set_state(JobState.FAILED, reason=reason)
            self._release(job)

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
        if job.config.get("colocate"):
            self._drop_unused_colocation_group(job.colocation_group)
        return job

    def _drop_unused_colocation_group(self, group: str | None) -> None:
        """Free a set of shared bundles once no colocated job of it is left, so the next may
        size them (and other groups may take its GPUs)."""
        with self._lock:
            if not self._live_colocated(group):
                self._placement.remove_shared(group)

    def _live_colocated(self, group: str | None) -> list[Job]:
        """The colocated jobs of colocation group ``group`` not finished yet (callers hold
        the lock)."""
        return [
            j
            for j in self.jobs.values()
            if j.config.get("colocate") and not j.state.terminal and j.colocation_group == group
        ]

    def stop_all(self) -> None:
        """Stop every job's workers and leave the job table as it is (for ``--resume``)."""
        import ray

        with self._table_lock:
            try:  # a clean stop folds the log into the snapshot
                if not self._frozen:
                    self._compact()
            except Exception as exc:
                logger.error("could not write the job table in %s: %s", self.run_dir, exc)
            self._journal.close()
            self._frozen = True
        for job in list(self.jobs.values()):
            job.cancel_requested = True
            # a job not running yet (workers never placed, or still loading) has nothing to
            # close: its workers are killed below instead of waiting a close out for each
            if job.workers and job.state is JobState.RUNNING:
                try:
                    ray.get([w.close.remote() for w in job.workers], timeout=60)
                except Exception as exc:
                    logger.warning("job %d: close failed: %s", job.job_id, exc)
            self._release(job)
        self._placement.remove_shared(every=True)

    def destroy_all(self) -> None:
        """Destroy every job that is not finished yet."""
        for job_id in list(self.jobs):
            try:
                self.destroy(job_id)
            except Exception as exc:
                logger.warning("destroying job %d failed: %s", job_id, exc)
        self._placement.remove_shared(every=True)
