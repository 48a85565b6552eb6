"""Weight-sync orchestration: moving a training job's weights into sampling and log-prob jobs.

``RLServer.sync_weights`` hands each request here. The pair worlds (one process group per
trainer/replica pair) stay alive in the workers between syncs of the same trainer and targets;
this class remembers which, and on which ports. A LoRA trainer (``training_config.lora``)
moves only its adapter, loaded by the targets under a versioned name; versions are kept per
(job, adapter). After ``restart_job`` of a training job, the jobs it last synced into get its
restored weights (``resync_after_restart``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from arctic_platform.rl import wire
from arctic_platform.rl.config import DEFAULT_ADAPTER, LoraConfig
from arctic_platform.rl.errors import InvalidRequestError, JobStateError
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.jobs import JobManager
from arctic_platform.rl.weight_sync.adapters import BASE_ADAPTER, lora_settings

logger = logging.getLogger(__name__)


def served_weights(job: Job, adapter: str | None, version: int | None) -> dict[str, Any]:
    """What a generate or log_probs request of ``job`` is answered with: ``weight_version``
    and, for a LoRA job, the ``adapter`` served (``base`` before any adapter sync). Asking a
    job that is not in LoRA mode for an adapter is an InvalidRequestError."""
    if lora_settings(job.config) is None:
        if adapter is not None or version is not None:
            raise InvalidRequestError(
                f"{job.job_type} job {job.job_id} is not in LoRA mode (its config has no "
                "training_config.lora), so it serves no adapter: leave adapter and "
                "adapter_version unset"
            )
        return {"weight_version": job.weight_version}
    if adapter == BASE_ADAPTER:
        if version is not None:
            raise InvalidRequestError(
                f"adapter {BASE_ADAPTER!r} is the base model, which has no versions: leave "
                "adapter_version unset"
            )
        return {"weight_version": 0, "adapter": BASE_ADAPTER}
    name = adapter or DEFAULT_ADAPTER
    latest = job.adapter_version(name)
    if adapter is None and version is None and latest == 0:
        return {"weight_version": 0, "adapter": BASE_ADAPTER}  # nothing synced in yet
    return {"weight_version": latest if version is None else version, "adapter": name}


def _served_rank(job: Job) -> int:
    """The largest adapter rank ``job`` serves: its ``vllm_config.max_lora_rank``, else the
    served rank of its ``training_config.lora``."""
    vllm = job.config.get("vllm_config") or {}
    if isinstance(vllm, dict) and vllm.get("max_lora_rank"):
        return int(vllm["max_lora_rank"])
    return LoraConfig.model_validate(lora_settings(job.config) or {}).served_rank


def _mode(job: Job) -> str:
    lora = lora_settings(job.config)
    return "full weights" if lora is None else f"a LoRA adapter (rank {lora.get('rank')})"


class WeightSyncOps:
    """Runs ``sync_weights`` over a ``JobManager``'s jobs and records where weights came from."""

    def __init__(self, jobs: JobManager, timeout: float, bucket_bytes: int) -> None:
        self.jobs = jobs
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        # trainer job -> (topology, base port, pair secret) of the pair worlds it keeps
        self._kept: dict[int, tuple[Any, int, str]] = {}
        # job -> the workers that said their engine loads LoRA adapters
        self._loads_adapters: dict[int, list[Any]] = {}

    def forget(self) -> None:
        """Drop every kept pair world (a restarted job's workers are new): the next sync
        builds new ones on fresh ports."""
        self._kept.clear()

    def sync(self, request: wire.SyncWeightsRequest) -> dict[str, Any]:
        """Move the training weights into every target replica with the WeightSyncCoordinator.

        The pair worlds stay alive in the workers between syncs of the same trainer and
        targets (same ports); after a failed sync, or for other targets, the next sync
        builds new ones on fresh ports."""
        from arctic_platform.rl.config import WeightSyncConfig
        from arctic_platform.rl.weight_sync.pair_auth import new_secret
        from arctic_platform.rl.weight_sync.strategy import DEFAULT_STRATEGY, check_strategy

        strategy = check_strategy(getattr(request, "strategy", None) or DEFAULT_STRATEGY)
        trainer = self.jobs.running(request.training_job_id, "training")
        targets = [self.jobs.running(j, "sampling") for j in request.sampling_job_ids]
        targets += [self.jobs.running(j, "log_prob") for j in request.log_prob_job_ids]
        if not targets:
            raise InvalidRequestError("sync_weights needs at least one sampling or log-prob job")
        source = getattr(request, "training_adapter", None)
        lora = self._check_modes(trainer, targets, request.adapter or source)
        adapter = (request.adapter or source or DEFAULT_ADAPTER) if lora is not None else None
        send_args = {} if source is None else {"adapter": source}
        replicas = [(job, worker) for job in targets for worker in job.workers]
        if lora is not None:
            self._check_adapter_loading(targets)
        zero = (trainer.config.get("ds_config") or {}).get("zero_optimization") or {}
        shared_memory = bool(trainer.config.get("colocate"))
        sharding = "fsdp" if int(zero.get("stage", 0) or 0) == 3 else "dp"
        # what the kept pair worlds were built for: same trainer workers, same targets
        topology = (
            len(trainer.workers),
            tuple((job.job_id, len(job.workers)) for job in targets),
            sharding,
            shared_memory,
            self.bucket_bytes,
        )
        if adapter is None:
            version = max(job.weight_version for job in targets) + 1
        else:
            version = max(job.adapter_version(adapter) for job in targets) + 1
        adapter_args = {} if lora is None else {"adapter": adapter, "lora": lora}
        started = time.monotonic()
        with trainer.lock:
            for job in targets:
                job.lock.acquire()
            kept = self._kept.pop(trainer.job_id, None)
            try:
                reuse = kept is not None and kept[0] == topology
                if kept is not None and reuse:
                    base_port, secret = kept[1], kept[2]
                else:
                    base_port, secret = self._base_port(trainer, len(replicas)), new_secret()
                sync = WeightSyncConfig(
                    training_sharding=sharding,
                    training_gpus=len(trainer.workers),
                    inference_replicas=len(replicas),
                    inference_tp=1,
                    base_port=base_port,
                    bucket_size=self.bucket_bytes,
                )
                data = sync.model_dump()
                senders = {rank: trainer.node_of(rank) for rank in range(len(trainer.workers))}
                send = [
                    w.sync_send.remote(
                        data, version, self.timeout, shared_memory, secret, **send_args
                    )
                    for w in trainer.workers
                ]
                receive = [
                    w.sync_receive.remote(
                        data,
                        i,
                        version,
                        self.timeout,
                        shared_memory,
                        strategy,
                        senders,
                        secret,
                        **adapter_args,
                    )
                    for i, (_, w) in enumerate(replicas)
                ]
                limit = self.timeout * 2 + 30
                self.jobs.call(trainer, send, "sync_weights (send)", timeout=limit)
                reports = []
                for i, (job, _) in enumerate(replicas):
                    reports.extend(
                        self.jobs.call(job, [receive[i]], "sync_weights (receive)", timeout=limit)
                    )
                for job in targets:
                    if adapter is not None:
                        job.adapter_versions[adapter] = version
                    if adapter in (None, DEFAULT_ADAPTER):
                        job.weight_version = version
                # only after a sync that worked
                self._kept[trainer.job_id] = (topology, sync.base_port, secret)
            finally:
                for job in targets:
                    job.lock.release()
        seconds = time.monotonic() - started
        # the tensors' own bytes, every target's; the buckets add alignment padding on the wire
        nbytes = sum(int(r.get("tensor_bytes", r["bytes"])) for r in reports)
        wire_bytes = sum(int(r["bytes"]) for r in reports)
        return {
            "weight_version": version,
            "adapter": adapter,
            "bytes": nbytes,
            "wire_bytes": wire_bytes,
            "seconds": seconds,
            "bandwidth_gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
            "path": "shared_memory" if shared_memory else "process_group",
            "strategy": strategy if adapter is None else "adapter",
            "reused_connections": sum(int(r.get("reused", 0)) for r in reports),
            "jobs": {str(job.job_id): version for job in targets},
        }

    @staticmethod
    def _check_modes(
        trainer: Job, targets: list[Job], adapter: str | None
    ) -> dict[str, Any] | None:
        """The trainer's LoRA signature (rank, target modules), or None for a full-weight
        sync; an InvalidRequestError naming both jobs when a target's mode differs from the
        trainer's, or an adapter that cannot be served, before anything moves."""
        lora = lora_settings(trainer.config)
        for job in targets:
            if (lora_settings(job.config) is None) != (lora is None):
                raise InvalidRequestError(
                    f"training job {trainer.job_id} trains {_mode(trainer)} but "
                    f"{job.job_type} job {job.job_id} serves {_mode(job)}: a sync needs both in "
                    "the same mode (the same training_config.lora; a full-weight sync into a "
                    "LoRA job would overwrite its frozen base)"
                )
        if lora is None:
            if adapter is not None:
                raise InvalidRequestError(
                    f"adapter={adapter!r}: training job {trainer.job_id} trains full weights, "
                    "so there is no adapter to sync; leave adapter unset"
                )
            return None
        if adapter == BASE_ADAPTER:
            raise InvalidRequestError(
                f"adapter {BASE_ADAPTER!r} names the base model without an adapter; a sync "
                "loads an adapter under another name (default: "
                f"{DEFAULT_ADAPTER!r})"
            )
        settings = LoraConfig.model_validate(lora)
        for job in targets:
            served = _served_rank(job)
            if settings.rank > served:
                raise InvalidRequestError(
                    f"training job {trainer.job_id}'s adapter has rank {settings.rank}, above "
                    f"the largest rank {job.job_type} job {job.job_id} serves ({served}); "
                    "create it with the trainer's training_config.lora"
                )
        return {"rank": settings.rank, "target_modules": list(settings.target_modules)}

    def _check_adapter_loading(self, targets: list[Job]) -> None:
        """Refuse, before anything moves, a target whose engine cannot load adapters (asked
        once per generation of a job's workers)."""
        for job in targets:
            if self._loads_adapters.get(job.job_id) is job.workers:
                continue
            workers = job.workers
            answers = self.jobs.call(
                job, [w.accepts_adapters.remote() for w in workers], "sync_weights (check)"
            )
            if not all(answers):
                raise InvalidRequestError(
                    f"{job.job_type} job {job.job_id} runs engine {job.engine!r}, which cannot "
                    "load LoRA adapters; use an engine that can (vllm) for a LoRA run"
                )
            self._loads_adapters[job.job_id] = workers

    def _base_port(self, trainer: Job, count: int) -> int:
        """Ports ``base .. base+count-1`` for the pair stores, free on every sender's node:
        the senders bind them, so they choose (rank 0 proposes, the others confirm)."""
        workers = trainer.workers
        for _ in range(8):
            base = int(
                self.jobs.call(trainer, [workers[0].free_port_range.remote(count)], "sync ports")[0]
            )
            checks = [w.ports_free.remote(base, count) for w in workers[1:]]
            if all(self.jobs.call(trainer, checks, "sync ports")) if checks else True:
                return base
        raise JobStateError(
            f"no {count} consecutive ports were free on every node of training job "
            f"{trainer.job_id} ({trainer.node_names()}) for the weight sync"
        )

    def record(
        self, request: wire.SyncWeightsRequest, result: dict[str, Any], why: str = ""
    ) -> None:
        """Note in the job table which trainer (and adapter) each target's weights came from;
        ``why`` is added to their ``weights_from``."""
        adapter = result.get("adapter")
        what = f" of adapter {adapter!r}" if adapter else ""
        for job_id in [*request.sampling_job_ids, *request.log_prob_job_ids]:
            job = self.jobs.jobs.get(job_id)
            if job is not None:
                job.synced_from = request.training_job_id
                job.synced_adapter = adapter
                job.weights_from = (
                    f"sync{what} from training job {request.training_job_id} "
                    f"(version {result.get('weight_version')}){why}"
                )
                job.changed()

    # --- a restarted trainer's weights --------------------------------------------------

    def resync_after_restart(self, trainer: Job) -> None:
        """Once the restarted ``trainer`` runs again (from its latest checkpoint), sync its
        restored weights into the jobs it last synced into, so none keeps serving weights
        the trainer no longer has; ``resync_pending`` lists them until then."""
        targets = [
            job
            for job in list(self.jobs.jobs.values())
            if job.synced_from == trainer.job_id
            and job.job_type != "training"
            and not job.state.terminal
        ]
        if not targets:
            return
        for job in targets:
            job.weights_from = (
                f"{job.weights_from} - stale: training job {trainer.job_id} restarted from "
                f"{trainer.weights_from}; its restored weights follow once it runs"
            )
            job.changed()
        trainer.resync_pending = [job.job_id for job in targets]
        trainer.changed()
        threading.Thread(
            target=self._resync,
            args=(trainer, trainer.restarts),
            daemon=True,
            name=f"resync-job-{trainer.job_id}",
        ).start()

    def _resync(self, trainer: Job, restart: int) -> None:
        """Wait until ``trainer`` (restart number ``restart``) runs, then sync it into its
        pending targets that run, one sync per adapter they last got."""
        limit = float(trainer.config.get("job_ready_timeout", 600.0)) + 60.0
        deadline = time.monotonic() + limit
        while trainer.restarts == restart and trainer.state is not JobState.RUNNING:
            if trainer.state.terminal or time.monotonic() > deadline:
                self._resynced(trainer, restart, f"not sent: the job is {trainer.state.value}")
                return
            time.sleep(0.2)
        if trainer.restarts != restart:
            return  # restarted again: that restart's resync takes over
        restored = trainer.weights_from
        groups: dict[str | None, list[Job]] = {}
        skipped = []
        for job_id in list(trainer.resync_pending):
            job = self.jobs.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                skipped.append(job_id)
                continue
            groups.setdefault(job.synced_adapter, []).append(job)
        notes = []
        for adapter, jobs in groups.items():
            request = wire.SyncWeightsRequest(
                training_job_id=trainer.job_id,
                sampling_job_ids=[j.job_id for j in jobs if j.job_type == "sampling"],
                log_prob_job_ids=[j.job_id for j in jobs if j.job_type == "log_prob"],
                adapter=adapter,
            )
            ids = [j.job_id for j in jobs]
            try:
                result = self.sync(request)
            except Exception as exc:
                logger.error(
                    "resync of training job %d into %s failed: %s", trainer.job_id, ids, exc
                )
                notes.append(f"sync into jobs {ids} failed ({type(exc).__name__}: {exc})")
                continue
            self.record(request, result, f" after its restart from {restored}")
            notes.append(f"synced into jobs {ids} as version {result['weight_version']}")
        if skipped:
            notes.append(f"jobs {skipped} were not running (sync them when they are)")
        self._resynced(trainer, restart, "; ".join(notes))

    @staticmethod
    def _resynced(trainer: Job, restart: int, note: str) -> None:
        """Clear ``trainer``'s pending resync and say in ``weights_from`` what it did."""
        if trainer.restarts != restart:
            return
        trainer.resync_pending = []
        trainer.weights_from = f"{trainer.weights_from}; restored weights {note}"
        trainer.changed()


__all__ = ["WeightSyncOps", "served_weights"]
