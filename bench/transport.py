"""Client → server overhead: ``generate`` and ``fwd_bwd`` through a transport vs in-process.

One run builds the tiny model and, for each transport, times the engines called directly in
this process and the same calls through ``ArcticRLClient`` (local backend, real server, real
Ray), alternating the two, and reports each as a ratio over the in-process time (goal <= 1.10).
It also times what a ``fwd_bwd``/``step`` with a request id pays to make its ledger entry
durable: the whole job table rewritten (what every call paid before the change log) against
one line appended to the log, for a small and a large table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.servers import loopback_config
from bench.timing import Side, paired


def _paired(
    direct: Callable[[], Any],
    through: Callable[[], Any],
    repeats: int,
    worker_seconds: Callable[[], float] | None = None,
    warmup: int = 8,
) -> dict[str, Any]:
    """Medians of ``direct`` and ``through``, timed in pairs after a warm-up of each.

    Pairs put both sides under the same load of this shared machine (the server's idle jobs
    and other processes), which timing one after the other does not. ``worker_seconds``
    (read outside the timed window) is the server's running total of time spent waiting for
    its workers on this operation: its change over a ``through`` call is that call's engine
    run in the worker, so ``through / worker`` is what the transport and the server add,
    free of how fast the engine ran in which process. A fresh worker runs its first calls
    slower than later ones (a fresh training worker's first ~5 ``fwd_bwd`` took 1.2-1.6 s,
    then ~0.6 s like the in-process engine), hence the warm-up calls.
    """
    counters = {"worker": worker_seconds} if worker_seconds else {}
    timing = paired(
        {"direct": direct, "through": Side(through, counters=counters)}, repeats, warmup
    )
    out: dict[str, Any] = {
        "direct_s": timing.median("direct"),
        "through_s": timing.median("through"),
        "paired_ratio": timing.ratio("through", "direct"),
    }
    if worker_seconds:
        out["worker_s"] = timing.median("through", "worker")
        out["over_worker"] = statistics.median(timing.per("through", "wall", "worker"))
    return out


def durability(jobs: tuple[int, ...] = (2, 64), calls: int = 40) -> dict[str, Any]:
    """Seconds and bytes per durable change of one job: whole-table snapshot vs log append."""
    from arctic_platform.rl.server.job_log import log_path
    from arctic_platform.rl.server.job_state import Job, JobState
    from arctic_platform.rl.server.job_table import JobJournal, JobTable, save_table, state_path
    from arctic_platform.rl.server.ledger import remember_request

    out: dict[str, Any] = {}
    for count in jobs:
        run_dir = Path(tempfile.mkdtemp(prefix="arctic-bench-table-"))
        all_jobs = []
        for job_id in range(1, count + 1):
            job = Job(job_id, "training", "deepspeed", {"model_name": "m"}, 1)
            job.state = JobState.RUNNING
            for i in range(128):  # a full request-id ledger, as after 64 steps
                remember_request(job.request_ids, f"fb:{i}", i, {"loss": 0.5, "tokens": 8192})
            all_jobs.append(job)
        job = all_jobs[0]
        t0 = time.perf_counter()
        for _ in range(calls):  # before: every call wrote the whole table
            save_table(
                run_dir, JobTable(next_job_id=count + 1, jobs=[j.record() for j in all_jobs])
            )
        snapshot_s = (time.perf_counter() - t0) / calls
        journal = JobJournal(run_dir)
        journal.compact(JobTable(next_job_id=count + 1, jobs=[j.record() for j in all_jobs]))
        before = log_path(run_dir).stat().st_size
        t0 = time.perf_counter()
        for i in range(calls):  # now: one line for the job that changed
            remember_request(job.request_ids, f"step:{i}", i, {"global_step": i + 1})
            journal.append(job.record(), count + 1)
        append_s = (time.perf_counter() - t0) / calls
        out[str(count)] = {
            "snapshot_s": snapshot_s,
            "snapshot_bytes": state_path(run_dir).stat().st_size,
            "append_s": append_s,
            "append_bytes": (log_path(run_dir).stat().st_size - before) / calls,
        }
        journal.close()
    return out


def _workload(vocab: int, rows: int, tokens: int, prompt_len: int) -> tuple[list, dict, dict]:
    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(rows)]
    batch = {
        "input_ids": [[rng.randrange(10, vocab) for _ in range(tokens)] for _ in range(rows)],
        "advantages": [rng.uniform(-1, 1) for _ in range(rows)],
    }
    params = {"n": 1, "max_tokens": tokens, "temperature": 1.0, "seed": 7}
    return prompts, batch, params


def run(
    rows: int = 64,
    tokens: int = 128,
    prompt_len: int = 16,
    repeats: int = 3,
    transports: tuple[str, ...] = ("http",),
) -> dict[str, Any]:
    """Time in-process engine calls against the same through each transport; returns ratios."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry
    from arctic_platform.rl.testing import build_tiny_model, free_port

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    base = loopback_config(model, free_port(), training_gpus=1, sampling_gpus=1)
    registry = get_registry()
    configs = {}
    for name in transports:
        config = base.model_copy(update={"comm_protocol": name})
        if name == "ray":
            config = config.model_copy(update={"host": None, "port": None})
        configs[name] = config
    pairs: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in transports}

    def pair_with_each_transport(op: str, in_process: Callable[[], Any], call: Any) -> None:
        for name, config in configs.items():
            os.environ["ARCTIC_RL_HOME"] = tempfile.mkdtemp(prefix=f"arctic-bench-{name}-")
            client = ArcticRLClient(config, progress=False)

            def worker_seconds(client: Any = client) -> float:
                return float(client.transport.call("metrics")["worker_seconds"].get(op, 0.0))

            try:
                pairs[name][op] = _paired(
                    in_process, partial(call, client), repeats, worker_seconds
                )
            finally:
                client.shutdown()

    # one in-process engine at a time (an in-process vLLM engine is built once per process)
    sampler = registry.get("engine", "vllm", role="sampling").create(
        base, EngineContext(role="sampling")
    )
    try:
        prompts, batch, params = _workload(len(sampler.tokenizer), rows, tokens, prompt_len)
        pair_with_each_transport(
            "generate",
            partial(sampler.generate, prompts, params),
            lambda client: client.generate(prompts, params),
        )
    finally:
        sampler.close()
    trainer = registry.get("engine", "deepspeed", role="training").create(
        base, EngineContext(role="training")
    )
    try:
        pair_with_each_transport(
            "fwd_bwd",
            partial(trainer.fwd_bwd, batch, "grpo"),
            lambda client: client.fwd_bwd(batch, "grpo"),
        )
    finally:
        trainer.close()
    return {
        "workload": {"rows": rows, "tokens": tokens, "prompt_len": prompt_len},
        "durability": durability(),
        "load_average": os.getloadavg(),
        "method": (
            "in-process and transport calls in pairs, order alternating, both engines alive; "
            "ratio: median through / median in-process; paired_ratio: median of the pairs' "
            "ratios; over_worker: median of through / the same call's wait for its worker"
        ),
        "transports": {
            name: {
                "seconds": {op: p["through_s"] for op, p in pairs[name].items()},
                "in_process_s": {op: p["direct_s"] for op, p in pairs[name].items()},
                "worker_s": {op: p["worker_s"] for op, p in pairs[name].items()},
                "ratio": {op: p["through_s"] / p["direct_s"] for op, p in pairs[name].items()},
                "paired_ratio": {op: p["paired_ratio"] for op, p in pairs[name].items()},
                "over_worker": {op: p["over_worker"] for op, p in pairs[name].items()},
            }
            for name in transports
        },
        "goal": 1.10,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    w = report["workload"]
    out = []
    for name, r in report["transports"].items():
        for op, ratio in r["ratio"].items():
            out.append(
                (
                    f"{op} via {name} vs in-process ({w['rows']}x{w['tokens']} tokens)",
                    f"{r['seconds'][op] * 1000:.0f} ms vs {r['in_process_s'][op] * 1000:.0f} ms",
                    f"{ratio:.3f} (pairs {r['paired_ratio'][op]:.3f})",
                )
            )
            out.append(
                (
                    f"{op} via {name} vs its own engine run in the worker",
                    f"{r['seconds'][op] * 1000:.0f} ms vs {r['worker_s'][op] * 1000:.0f} ms",
                    f"{r['over_worker'][op]:.3f}",
                )
            )
    for count, d in report.get("durability", {}).items():
        out.append(
            (
                f"job-table write per fwd_bwd/step: log append vs whole table ({count} jobs)",
                f"{d['append_s'] * 1000:.1f} ms, {d['append_bytes']:.0f} B vs "
                f"{d['snapshot_s'] * 1000:.1f} ms, {d['snapshot_bytes']} B",
                f"{d['append_s'] / d['snapshot_s']:.3f}",
            )
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transports", default="http,ray")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        json.dumps(
            run(repeats=args.repeats, transports=tuple(args.transports.split(","))), indent=2
        )
    )
