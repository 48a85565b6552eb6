"""Weight-sync orchestration: moving a training job's weights into sampling and log-prob jobs.

``RLServer.sync_weights`` hands each request here. The pair worlds (one process group per
trainer/replica pair) stay alive in the workers between syncs of the same trainer and targets;
this class remembers which, and on which ports.
"""

from __future__ import annotations

import time
from typing import Any

from arctic_platform.rl import wire
from arctic_platform.rl.errors import InvalidRequestError, JobStateError
from arctic_platform.rl.server.job_state import Job
from arctic_platform.rl.server.jobs import JobManager


class WeightSyncOps:
    """Runs ``sync_weights`` over a ``JobManager``'s jobs and records where weights came from."""

    def __init__(self, jobs: JobManager, timeout: float, bucket_bytes: int) -> None:
        self.jobs = jobs
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        # trainer job -> (topology, base port, pair secret) of the pair worlds it keeps
        self._kept: dict[int, tuple[Any, int, str]] = {}

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
        replicas = [(job, worker) for job in targets for worker in job.workers]
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
        version = max(job.weight_version for job in targets) + 1
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
                    w.sync_send.remote(data, version, self.timeout, shared_memory, secret)
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
                    job.weight_version = version
                # only after a sync that worked
                self._kept[trainer.job_id] = (topology, sync.base_port, secret)
            finally:
                for job in targets:
                    job.lock.release()
        seconds = time.monotonic() - started
        nbytes = sum(int(r["bytes"]) for r in reports)
        return {
            "weight_version": version,
            "bytes": nbytes,
            "seconds": seconds,
            "bandwidth_gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
            "path": "shared_memory" if shared_memory else "process_group",
            "strategy": strategy,
            "reused_connections": sum(int(r.get("reused", 0)) for r in reports),
            "jobs": {str(job.job_id): job.weight_version for job in targets},
        }

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

    def record(self, request: wire.SyncWeightsRequest, result: dict[str, Any]) -> None:
        """Note in the job table which trainer each target's weights came from."""
        for job_id in [*request.sampling_job_ids, *request.log_prob_job_ids]:
            job = self.jobs.jobs.get(job_id)
            if job is not None:
                job.synced_from = request.training_job_id
                job.weights_from = (
                    f"sync from training job {request.training_job_id} "
                    f"(version {result.get('weight_version')})"
                )
                job.changed()


__all__ = ["WeightSyncOps"]
