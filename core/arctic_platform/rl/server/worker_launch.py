"""Starting a job's workers: EngineWorker actors in its placement group, their nodes and
ports, and the engines' setup, as the job goes ``placing -> initializing -> running``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.server.job_state import Job

logger = logging.getLogger(__name__)


def engine_spec(engine: str, job_type: str) -> Any:
    """The registered ``EngineSpec`` of a job: its plugin facts (concurrency, export layout)."""
    from arctic_platform.rl.plugins import get_registry

    return get_registry().get("engine", engine, role=job_type)


PASSED_ON = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "ARCTIC_RL_METRICS",
    "ARCTIC_RL_PEAK_FLOPS",
)
"""The server's environment its workers get, also on nodes started elsewhere: the network
interfaces (otherwise each worker takes the one holding its node's address) and the metrics
switches (``observe``)."""


def user_interface_env() -> dict[str, str]:
    """The variables of ``PASSED_ON`` set for this server: passed on to the workers."""
    import os

    return {k: os.environ[k] for k in PASSED_ON if os.environ.get(k)}


def start_workers(
    job: Job,
    placement: Callable[[Job], tuple[Any, list[float]]],
    run_dir: Path,
    op_timeout: float,
) -> None:
    """Place ``job``, start its workers and set their engines up; returns early (state left
    as it is) when the job is cancelled meanwhile, raises on any failure."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from arctic_platform.rl.server.job_state import JobState
    from arctic_platform.rl.server.worker import EngineWorker

    timeout = float(job.config.get("job_ready_timeout", 600.0))
    deadline = time.monotonic() + timeout
    job.set_state(JobState.PLACING)
    pg, fractions = placement(job)
    job.placement_group = pg
    while not wait_ready(pg.ready(), 1.0):
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
    work_dir = run_dir / "jobs" / str(job.job_id)
    work_dir.mkdir(parents=True, exist_ok=True)
    remote_cls: Any = ray.remote(EngineWorker)
    workers = []
    user_env = user_interface_env()
    for index, fraction in enumerate(fractions):
        env = {
            "RANK": str(index),
            "LOCAL_RANK": "0",  # one bundle, one (logical) GPU per worker
            "WORLD_SIZE": str(job.num_gpus if job.job_type == "training" else 1),
            "ARCTIC_RL_JOB_ID": str(job.job_id),
            "ARCTIC_RL_OP_TIMEOUT": str(op_timeout),  # engines' own waits
            **user_env,
        }
        if job.job_type != "training":
            env["RANK"] = "0"
        rank = index if job.job_type == "training" else 0
        world = job.num_gpus if job.job_type == "training" else 1
        worker = remote_cls.options(
            num_cpus=0,
            num_gpus=fraction,
            # the engine says how many calls it takes at once (a request loop that
            # batches concurrent generates takes many)
            max_concurrency=engine_spec(job.engine, job.job_type).max_concurrency,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            ),
            name=None,
        ).remote(
            job.job_type,
            job.engine,
            {**job.config, **job.launch_overrides},
            rank,
            world,
            index,
            str(work_dir),
            env,
        )
        workers.append(worker)
    job.workers = workers
    # every address and port comes from the worker that uses it, on its own node
    infos = await_refs(job, [w.node.remote() for w in workers], deadline, "start")
    if infos is None:
        return
    job.nodes = [{"address": i["address"], "node_id": i["node_id"]} for i in infos]
    if job.job_type == "training":  # one world: rank 0 listens on its node
        port = await_refs(job, [workers[0].free_port.remote()], deadline, "start")
        if port is None:
            return
        envs = [{"MASTER_ADDR": job.node_of(0), "MASTER_PORT": str(port[0])}] * len(workers)
    else:  # worlds of one: each worker on its own node
        ports = await_refs(job, [w.free_port.remote() for w in workers], deadline, "start")
        if ports is None:
            return
        envs = [{"MASTER_ADDR": job.node_of(i), "MASTER_PORT": str(p)} for i, p in enumerate(ports)]
    logger.info(
        "job %d (%s): workers on %s",
        job.job_id,
        job.job_type,
        ", ".join(f"{i}@{job.node_of(i)}" for i in range(len(workers))),
    )
    done = await_refs(
        job,
        [w.setup.remote(e) for w, e in zip(workers, envs, strict=True)],
        deadline,
        "be ready",
    )
    if done is None:
        return
    job.worker_pids = [int(info["pid"]) for info in done]
    started_from = {**job.config, **job.launch_overrides}.get("checkpoint_path")
    if job.job_type == "training" and started_from:  # a resume: at its saved step
        step = ray.get(workers[0].global_step.remote(), timeout=op_timeout)
        job.global_step = int(step)
    job.set_state(JobState.RUNNING)


def await_refs(job: Job, refs: list[Any], deadline: float, what: str) -> list[Any] | None:
    """Results of ``refs`` once all are in; None when the job was cancelled meanwhile."""
    import ray

    pending = list(refs)
    timeout = float(job.config.get("job_ready_timeout", 600.0))
    while pending:
        if job.cancel_requested:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"engines of job {job.job_id} did not {what} within job_ready_timeout={timeout}s"
            )
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(1.0, remaining))
    return list(ray.get(refs))


def wait_ready(ref: Any, timeout: float) -> bool:
    """Whether ``ref`` is ready within ``timeout`` seconds."""
    import ray

    ready, _ = ray.wait([ref], timeout=timeout)
    return bool(ready)


__all__ = ["await_refs", "engine_spec", "start_workers", "user_interface_env", "wait_ready"]
