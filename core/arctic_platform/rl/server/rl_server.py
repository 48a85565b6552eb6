"""``RLServer``: every server operation, transport-free.

Transports (http, ray) call ``RLServer.handle(name, payload)`` or the typed methods directly;
each method takes its validated request model from ``arctic_platform.rl.wire`` and returns
plain data (dicts, lists, numbers).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from arctic_platform.rl import __version__, wire
from arctic_platform.rl.agents.journal import SessionJournal
from arctic_platform.rl.batch import Batch, BatchLimits
from arctic_platform.rl.errors import (
    InvalidRequestError,
    JobStateError,
)
from arctic_platform.rl.observe import discovery
from arctic_platform.rl.observe import recorder as observe
from arctic_platform.rl.observe.server_metrics import (
    RequestMeter,
    record_jobs,
    record_start,
    record_sync,
)
from arctic_platform.rl.server.agent_ops import AgentOps
from arctic_platform.rl.server.call_clock import CallClock
from arctic_platform.rl.server.checkpoint_ops import CheckpointOps
from arctic_platform.rl.server.checkpoints import (
    check_checkpoint_path,
    record_checkpoint,
)
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.jobs import JobManager
from arctic_platform.rl.server.ledger import (
    ledger_entry,
    remember_request,
    replay_request,
    roll_back_requests,
)
from arctic_platform.rl.server.memory_ops import MemoryOps
from arctic_platform.rl.server.weight_sync_ops import WeightSyncOps, served_weights
from arctic_platform.rl.wire import describe_errors
from arctic_platform.rl.wire.operations import BY_NAME

logger = logging.getLogger(__name__)

SESSIONS_DIR = "sessions"
"""The run dir's folder of agent sessions on disk (``SessionJournal``)."""


def _split(items: list[Any], parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges spreading ``items`` over ``parts`` as evenly as possible."""
    n = len(items)
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


class RLServer(CheckpointOps, MemoryOps):
    """The server's operations over a ``JobManager`` on Ray."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        num_gpus: int = 0,
        ray_auto_attach: bool = True,
        ray_address: str | None = None,
        op_timeout: float = 900.0,
        monitor_interval: float = 5.0,
        sync_timeout: float = 120.0,
        sync_bucket_bytes: int = 256 * 1024 * 1024,
        resume: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_gpus = num_gpus
        self.ray_auto_attach = ray_auto_attach
        self.ray_address = ray_address
        self.resume = resume
        settings = {"num_gpus": num_gpus, "op_timeout": op_timeout, **(settings or {})}
        self.jobs = JobManager(self.run_dir, op_timeout=op_timeout, server_settings=settings)
        self.cluster: Any = None
        self.started_at = time.time()
        self.monitor_interval = monitor_interval
        self.weight_sync = WeightSyncOps(self.jobs, sync_timeout, sync_bucket_bytes)
        self.agents = AgentOps(
            self.jobs, self.generate, SessionJournal(self.run_dir / SESSIONS_DIR)
        )
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        # per training job, the workers its request ids were last checked against
        self._restored_for: dict[int, list[Any]] = {}
        # per job, the batch limits its current workers reported (asked once per generation)
        self._limits_for: dict[int, tuple[list[Any], BatchLimits | None]] = {}
        self.requests = RequestMeter()
        self.shutdown_requested = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> RLServer:
        """Start or attach to Ray, take over the run dir's job table, watch job health.

        Jobs of an earlier server in this run dir keep their ids: with ``resume`` they start
        again from their latest checkpoints, without it they are marked failed (restartable).
        Agent sessions on those jobs come back with ``resume`` and are forgotten without it.
        """
        from arctic_platform.rl.server.ray_cluster import start_or_attach

        self.cluster = start_or_attach(
            num_gpus=self.num_gpus,
            run_dir=self.run_dir,
            ray_auto_attach=self.ray_auto_attach,
            address=self.ray_address,
        )
        self.jobs.load_previous(resume=self.resume)
        self.agents.load_previous(resume=self.resume)
        self._observe_cluster()
        self._monitor = threading.Thread(target=self._watch, daemon=True, name="job-monitor")
        self._monitor.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.monitor_interval):
            try:
                self.jobs.check_alive()
            except Exception as exc:  # never let the monitor die
                logger.warning("job monitor: %s", exc)
            self._observe_cluster()

    def _observe_cluster(self) -> None:
        """Jobs by state, and the Prometheus targets of the cluster's nodes (``observe``)."""
        if not observe.metrics_enabled():
            return
        try:
            record_jobs(list(self.jobs.jobs.values()))
            discovery.refresh(self.run_dir)
        except Exception as exc:  # metrics never stop the monitor
            logger.debug("metrics: %s", exc)

    def close(self) -> None:
        """Stop every job's workers and leave Ray (a cluster started here stops with it).

        The job table keeps the jobs' states, so ``serve --resume`` can bring them back; jobs
        a client destroyed (``destroy``, ``shutdown``) stay terminated.
        """
        self._stop.set()
        self.jobs.stop_all()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None

    # --- dispatch -----------------------------------------------------------------------

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        """Validate ``payload`` against operation ``name``'s request model and run it."""
        op = BY_NAME.get(name)
        if op is None:
            raise InvalidRequestError(f"unknown operation {name!r}")
        try:
            request = op.request.model_validate(payload or {})
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid {name} request: {describe_errors(exc)}") from None
        outcome = self.requests.start(name, self._job_type_of(request))
        try:
            result = getattr(self, name)(request)
            if isinstance(request, wire.SyncWeightsRequest):
                self.weight_sync.record(request, result)
                targets = ["sampling"] * bool(request.sampling_job_ids)
                record_sync(result, targets + ["log_prob"] * bool(request.log_prob_job_ids))
            return result
        except Exception as exc:
            outcome.failed(exc)
            raise
        finally:
            outcome.done()

    def _job_type_of(self, request: Any) -> str:
        """The type of the job a request is about (``-`` when none): a bounded label."""
        job_id = getattr(request, "job_id", None)
        if job_id is None:
            job_id = getattr(request, "training_job_id", None)
        job = self.jobs.jobs.get(job_id) if isinstance(job_id, int) else None
        return job.job_type if job is not None else "-"

    # --- control ------------------------------------------------------------------------

    def health(self, _: wire.EmptyRequest | None = None) -> dict[str, Any]:
        """Liveness: answers without touching Ray."""
        return {"status": "ok", "version": __version__, "uptime": time.time() - self.started_at}

    def status(self, _: wire.EmptyRequest | None = None) -> dict[str, Any]:
        """Every job's public view, and the cluster."""
        cluster = self.cluster.describe() if self.cluster is not None else None
        return {
            "version": __version__,
            "jobs": [job.describe() for job in self.jobs.jobs.values()],
            "cluster": cluster,
        }

    def metrics(self, _: wire.EmptyRequest | None = None) -> dict[str, Any]:
        """Request counts, errors, seconds per operation and per worker wait; jobs by state."""
        states: dict[str, int] = defaultdict(int)
        for job in self.jobs.jobs.values():
            states[job.state.value] += 1
        return {
            **self.requests.totals(),
            "worker_seconds": {k: round(v, 6) for k, v in self.jobs.worker_seconds().items()},
            "jobs_by_state": dict(states),
        }

    def get_job(self, request: wire.GetJobRequest) -> dict[str, Any]:
        """One job's public view; with ``request_id``, what its request-id ledger holds for
        that fwd_bwd/step id (``request``), after any restore it has not accounted for yet."""
        job = self.jobs.get(request.job_id)
        if request.request_id is None:
            return job.describe()
        with job.lock:
            if job.state is JobState.RUNNING:
                self._settle(job)
            held = {
                name: ledger_entry(job.request_ids, f"{prefix}:{request.request_id}")
                for name, prefix in (("fwd_bwd", "fb"), ("step", "step"))
            }
            return {**job.describe(), "request": {"request_id": request.request_id, **held}}

    def initialize(self, request: wire.InitializeRequest) -> dict[str, Any]:
        """Create one job; returns its id at once while it is placed in the background."""
        extra = request.config.get("training_config") or {}
        if isinstance(extra, dict):
            from arctic_platform.rl.config import TrainingConfig

            known = set(TrainingConfig.model_fields)
            ignored = sorted(set(extra) - known)
            if ignored:
                logger.debug("training_config: ignoring extra fields %s", ignored)
        check_checkpoint_path(request.config)
        job = self.jobs.create(
            request.job_type, request.config, colocation_group=request.colocation_group
        )
        record_start(job.job_type, "create")
        return {"job_id": job.job_id, "state": job.state.value}

    def destroy(self, request: wire.JobRequest) -> dict[str, Any]:
        """Stop a job and free its GPUs."""
        return self.jobs.destroy(request.job_id).describe()

    def restart_job(self, request: wire.JobRequest) -> dict[str, Any]:
        """Start a failed job again with the same id; returns at once (poll ``get_job``).

        Training comes back from its latest checkpoint, and once it runs the jobs it last
        synced into get its restored weights as a new weight version (``resync_pending``
        lists them until then; ``weights_from`` says what happened). Sampling and log-prob
        come back on the newest weights they can load (``weights_from`` says which);
        ``sync_weights`` brings them the trainer's current weights.
        """
        job = self.jobs.restart(request.job_id)
        record_start(job.job_type, "restart")
        # weight-sync pair worlds kept between syncs were built with the old workers
        self.weight_sync.forget()
        if job.job_type == "training":
            self.weight_sync.resync_after_restart(job)
        return job.describe()

    def shutdown(self, _: wire.EmptyRequest | None = None) -> dict[str, Any]:
        """Destroy all jobs and ask the transport to stop serving."""
        self.jobs.destroy_all()
        self.shutdown_requested.set()
        return {"status": "shutting down"}

    # --- helpers ------------------------------------------------------------------------

    def _batch_limits(self, job: Job) -> BatchLimits | None:
        """What ``job``'s engine accepts (vocabulary, context), asked once of its workers."""
        known = self._limits_for.get(job.job_id)
        if known is not None and known[0] is job.workers:
            return known[1]
        workers = job.workers
        limits = self.jobs.call(job, [workers[0].batch_limits.remote()], "batch_limits")[0]
        self._limits_for[job.job_id] = (workers, limits)
        return limits

    @staticmethod
    def _shared(batch: Batch) -> Any:
        """``batch`` put in Ray's object store once: every rank reads the same copy."""
        import ray

        return ray.put(batch)

    def _all_ranks(self, job: Job, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        refs = [w.call.remote(method, *args, **kwargs) for w in job.workers]
        return self.jobs.call(job, refs, method)

    def _settle(self, job: Job) -> None:
        """Once per generation of a training job's workers, note what they were restored to.

        Workers this server has not seen on the job yet (a restart, or ``serve --resume``)
        were restored from its latest checkpoint, at the step the engine reported
        (``job.global_step``): the request ids applied on that step or later are marked
        rolled back, and the table's step for that checkpoint path is what the engine found
        there (a save of the same tag cut short can leave a newer complete copy). Call under
        ``job.lock``.
        """
        if self._restored_for.get(job.job_id) is job.workers:
            return
        self._restored_for[job.job_id] = job.workers
        changed = roll_back_requests(job.request_ids, job.global_step) > 0
        restored_from = job.launch_overrides.get("checkpoint_path")
        if restored_from:
            changed = record_checkpoint(job, job.global_step, str(restored_from)) or changed
        if changed:
            job.changed()

    def _replayed(self, job: Job, key: str | None) -> dict[str, Any] | None:
        """Request ``key``'s first result on ``job``, marked ``replayed`` (None: apply it now);
        call under job.lock."""
        self._settle(job)
        if key is None:
            return None
        previous = replay_request(job.request_ids, key, job.job_id, job.global_step)
        return None if previous is None else {**previous, "replayed": True}

    def _remember(self, job: Job, key: str | None, base_step: int, result: Any) -> None:
        """Record request ``key``'s result (the caller writes the job table before answering)."""
        if key is not None:
            remember_request(job.request_ids, key, base_step, result)

    def _once(
        self, job: Job, key: str | None, clock: CallClock, apply: Callable[[int], dict[str, Any]]
    ) -> dict[str, Any]:
        """Under ``job.lock``: request ``key``'s first result, replayed, or else ``clock``
        started and ``apply(base_step)`` (the step the request was applied at) answered."""
        with job.lock:
            if (replayed := self._replayed(job, key)) is not None:
                return replayed
            clock.start()
            return apply(job.global_step)

    # --- training -----------------------------------------------------------------------

    def fwd_bwd(self, request: wire.FwdBwdRequest) -> dict[str, Any]:
        """Accumulate gradients on every training rank; returns rank 0's reduced metrics."""
        job = self.jobs.running(request.job_id, "training")
        batch = request.batch.check(self._batch_limits(job))  # built by the request model
        key = request.request_id and f"fb:{request.request_id}"
        clock = CallClock()
        options = request.adapter_kwargs()
        if request.return_log_probs or request.forward_only:
            options |= {
                "return_log_probs": request.return_log_probs,
                "forward_only": request.forward_only,
            }

        def apply(base_step: int) -> dict[str, Any]:
            results = self._all_ranks(
                job, "fwd_bwd", self._shared(batch), request.loss_fn, request.loss_config, **options
            )
            result = dict(results[0]) | clock.figures(batch_tokens=batch.num_tokens)
            if not request.forward_only:  # the table keeps metrics, not per-token outputs
                kept = {k: v for k, v in result.items() if k != "log_probs"}
                self._remember(job, key, base_step, kept)
                if key is not None:
                    job.changed()
            return result

        return self._once(job, key, clock, apply)

    def fwd_no_grad(self, request: wire.FwdNoGradRequest) -> dict[str, Any]:
        """Per-token log-probs from a training job (or a log-prob job)."""
        job = self.jobs.get(request.job_id)
        job = self.jobs.running(request.job_id, job.job_type)
        if job.job_type == "sampling":
            raise JobStateError(
                f"job {job.job_id} is a sampling job; fwd_no_grad needs training or log_prob"
            )
        batch = request.batch.check(self._batch_limits(job))
        clock = CallClock()
        with job.lock:
            clock.start()
            if job.job_type == "training":
                shared = self._shared(batch)
                named = request.adapter_kwargs()
                results = self._all_ranks(
                    job, "fwd_no_grad", shared, request.reference_model, **named
                )
                return {"log_probs": results[0], **clock.figures(tokens=batch.num_tokens)}
            rows = list(range(batch.num_rows))
            log_probs = self._spread(
                job,
                "fwd_no_grad",
                rows,
                lambda part: (batch.select(part),),
                request.adapter_kwargs(),
            )
            return {"log_probs": log_probs, **clock.figures(tokens=batch.num_tokens)}

    def step(self, request: wire.StepRequest) -> dict[str, Any]:
        """One optimizer step on every rank."""
        job = self.jobs.running(request.job_id, "training")
        key = request.request_id and f"step:{request.request_id}"
        clock = CallClock()
        adam = request.optimizer_params()
        args = (request.learning_rate, adam) if adam else (request.learning_rate,)

        def apply(base_step: int) -> dict[str, Any]:
            results = self._all_ranks(job, "step", *args, **request.adapter_kwargs())
            result = dict(results[0]) | clock.figures()
            job.global_step = int(result.get("global_step", job.global_step + 1))
            self._remember(job, key, base_step, result)
            job.changed()
            return result

        return self._once(job, key, clock, apply)

    def add_adapter(self, request: wire.AddAdapterRequest) -> dict[str, Any]:
        """A new named LoRA adapter on every rank of a training job (``adapters`` listed)."""
        job = self.jobs.running(request.job_id, "training")
        with job.lock:
            return dict(self._all_ranks(job, "add_adapter", request.adapter, request.seed)[0])

    def remove_adapter(self, request: wire.RemoveAdapterRequest) -> dict[str, Any]:
        """Drop a named adapter from a training job, or every version of it a sampling or
        log-prob job serves (its version count starts again)."""
        job = self.jobs.get(request.job_id)
        job = self.jobs.running(request.job_id, job.job_type)
        with job.lock:
            result = dict(self._all_ranks(job, "remove_adapter", request.adapter)[0])
            if job.adapter_versions.pop(request.adapter, None) is not None:
                job.changed()
            return result

    def empty_training_cache(self, request: wire.JobRequest) -> dict[str, Any]:
        """Release cached allocator memory on the training ranks."""
        job = self.jobs.running(request.job_id, "training")
        with job.lock:
            self._all_ranks(job, "empty_cache")
        return {"ok": True}

    # --- inference ----------------------------------------------------------------------

    def _spread(
        self,
        job: Job,
        method: str,
        items: list[Any],
        make_args: Any,
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Split ``items`` over the job's replicas, call them in parallel (each with the same
        ``kwargs``), rejoin in order."""
        ranges = _split(items, len(job.workers))
        refs = [
            job.workers[i].call.remote(method, *make_args(items[a:b]), **(kwargs or {}))
            for i, (a, b) in enumerate(ranges)
        ]
        out: list[Any] = []
        for part in self.jobs.call(job, refs, method):
            out.extend(part)
        return out

    def generate(self, request: wire.GenerateRequest) -> dict[str, Any]:
        """Rollouts spread over the sampling replicas; reports the served weight version."""
        job = self.jobs.running(request.job_id, "sampling")
        served = self._served(job, request)
        params = dict(request.sampling_params)
        prompts = list(request.prompts)
        clock = CallClock()
        outputs = self._spread(
            job, "generate", prompts, lambda part: (part, params), request.adapter_kwargs()
        )
        figures = clock.figures(
            prompt_tokens=sum(len(o.get("prompt_token_ids") or ()) for o in outputs),
            completion_tokens=sum(
                len(c.get("token_ids") or ()) for o in outputs for c in o.get("completions", ())
            ),
        )
        return {"outputs": outputs, **served, **figures}

    def log_probs(self, request: wire.LogProbsRequest) -> dict[str, Any]:
        """Log-probs of completions from the log-prob job's replicas."""
        job = self.jobs.running(request.job_id, "log_prob")
        served = self._served(job, request)
        if len(request.prompts) != len(request.completions):
            raise InvalidRequestError(
                f"{len(request.prompts)} prompts but {len(request.completions)} completions"
            )
        pairs = list(zip(request.prompts, request.completions, strict=True))
        clock = CallClock()
        outputs = self._spread(
            job,
            "log_probs",
            pairs,
            lambda part: ([p for p, _ in part], [c for _, c in part], request.top_k),
            request.adapter_kwargs(),
        )
        tokens = sum(len(o.get("log_probs") or ()) for o in outputs if isinstance(o, dict))
        return {"outputs": outputs, **served, **clock.figures(tokens=tokens)}

    @staticmethod
    def _served(job: Job, request: wire.AdapterRequest) -> dict[str, Any]:
        """The weights a generate or log_probs request is answered with: ``weight_version``
        (of the adapter in a LoRA job) and, in a LoRA job, ``adapter``. An adapter asked of a
        job that is not in LoRA mode is refused."""
        return served_weights(job, request.adapter, request.adapter_version)

    def reset_prefix_cache(self, request: wire.JobRequest) -> dict[str, Any]:
        """Drop cached prefixes on every replica of a sampling or log-prob job."""
        job = self.jobs.get(request.job_id)
        job = self.jobs.running(request.job_id, job.job_type)
        if job.job_type == "training":
            raise JobStateError(f"job {job.job_id} is a training job; it has no prefix cache")
        self._all_ranks(job, "reset_prefix_cache")
        return {"ok": True}

    # --- agent sessions (``agent_ops``) ----------------------------------------------------

    def open_session(self, request: wire.OpenSessionRequest) -> dict[str, Any]:
        """Open an agent session on a sampling job: its id, key and OpenAI base path."""
        return self.agents.open_session(request)

    def list_sessions(self, request: wire.ListSessionsRequest) -> dict[str, Any]:
        """The open agent sessions (of one sampling job when ``job_id`` is given)."""
        return self.agents.list_sessions(request)

    def close_session(self, request: wire.SessionRequest) -> dict[str, Any]:
        """Close an agent session."""
        return self.agents.close_session(request)

    def session_trajectory(self, request: wire.SessionRequest) -> dict[str, Any]:
        """An agent session's turns and merged training rows (the ``Batch`` fields)."""
        return self.agents.session_trajectory(request)

    # --- weights ------------------------------------------------------------------------

    def sync_weights(self, request: wire.SyncWeightsRequest) -> dict[str, Any]:
        """Move the training weights into every target replica with the WeightSyncCoordinator.

        The pair worlds stay alive in the workers between syncs of the same trainer and
        targets (same ports); after a failed sync, or for other targets, the next sync
        builds new ones on fresh ports."""
        return self.weight_sync.sync(request)

    def weight_norm(self, request: wire.WeightNormRequest) -> dict[str, Any]:
        """L2 norm of each job's weights (every replica; they must agree)."""
        norms: dict[str, Any] = {}
        for job_id in request.job_ids:
            job = self.jobs.get(job_id)
            job = self.jobs.running(job_id, job.job_type)
            with job.lock:
                values = self._all_ranks(job, "weight_norm")
            norms[str(job_id)] = {
                "job_type": job.job_type,
                "norm": float(values[0]),
                "replicas": [float(v) for v in values],
            }
        return {"norms": norms}


__all__ = ["JobState", "RLServer"]
