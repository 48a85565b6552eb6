"""Load: N client processes x M concurrent ``generate`` requests against one http server.

Each request carries a unique tag as its prompt token ids, which the server echoes back in
``prompt_token_ids``; the server's own ``/metrics`` count is read before and after. So every
request is accounted for exactly once on both sides: answered, failed, duplicated or lost.
Latency is per request (send to answer, in the client process); the ratios compare the load
p50 with the p50 of the same request sent alone, one at a time, and the load's wall time
with all the same prompts sent as one request, in the same run.

``python -m bench.load`` starts its own server (local backend, a sampling job on the tiny
model), runs 8 x 50, prints the figures and writes ``bench/load_results.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import loopback_config
from bench.timing import paired, timed

HERE = Path(__file__).resolve().parent
TAG_BASE = 50
TAG_RADIX = 300  # tags lie in [TAG_BASE, TAG_BASE + TAG_RADIX): the tiny vocabulary has 425


def tag(process: int, index: int) -> list[int]:
    """The prompt token ids that identify request ``index`` of client ``process``."""
    return [
        TAG_BASE + process % TAG_RADIX,
        TAG_BASE + index % TAG_RADIX,
        TAG_BASE + index // TAG_RADIX,
    ]


def _client_process(
    base_url: str,
    token: str,
    job_id: int,
    process: int,
    concurrency: int,
    max_tokens: int,
    timeout: float,
    go: Any,
    results: Any,
) -> None:
    """One client process: ``concurrency`` requests at once on one kept-alive transport."""
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    from arctic_rl_http.client import HttpTransport

    url = urlsplit(base_url)
    transport = HttpTransport(str(url.hostname), int(url.port or 80), token, timeout=timeout)
    params = {"n": 1, "max_tokens": max_tokens, "temperature": 0.0}

    def one(index: int) -> dict[str, Any]:
        sent = tag(process, index)
        started = time.perf_counter()
        try:
            answer = transport.call(
                "generate", {"job_id": job_id, "prompts": [sent], "sampling_params": params}
            )
        except Exception as exc:
            return {
                "process": process,
                "index": index,
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:300],
                "seconds": time.perf_counter() - started,
            }
        seconds = time.perf_counter() - started
        outputs = answer.get("outputs") or []
        echoed = [list(map(int, o.get("prompt_token_ids", []))) for o in outputs]
        return {
            "process": process,
            "index": index,
            "ok": echoed == [sent] and bool(outputs[0].get("completions")),
            "echoed": echoed,
            "seconds": seconds,
        }

    go.wait()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records = list(pool.map(one, range(concurrency)))
    transport.close()
    results.put((process, records))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


def _server_count(base_url: str, token: str) -> tuple[int, int]:
    import httpx

    metrics = httpx.get(
        f"{base_url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    return int(metrics["requests"].get("generate", 0)), int(metrics["errors"].get("generate", 0))


def drive(
    base_url: str,
    token: str,
    job_id: int,
    *,
    processes: int = 8,
    concurrency: int = 50,
    max_tokens: int = 8,
    deadline: float = 600.0,
    solo_requests: int = 10,
) -> dict[str, Any]:
    """Run the load and account for every request; never waits past ``deadline`` seconds."""
    from urllib.parse import urlsplit

    from arctic_rl_http.client import HttpTransport

    url = urlsplit(base_url)
    solo = HttpTransport(str(url.hostname), int(url.port or 80), token, timeout=deadline)
    params = {"n": 1, "max_tokens": max_tokens, "temperature": 0.0}
    tags = itertools.count()

    def one_alone() -> None:
        prompts = [tag(9999, next(tags))]
        solo.call("generate", {"job_id": job_id, "prompts": prompts, "sampling_params": params})

    # the same prompts in one request: what the engine does with all of them batched
    every = [tag(p, i) for p in range(processes) for i in range(concurrency)]

    def all_batched() -> None:
        solo.call("generate", {"job_id": job_id, "prompts": every, "sampling_params": params})

    solo_seconds: list[float] = []  # the first request alone is a warm-up
    if solo_requests:
        solo_seconds = paired({"solo": one_alone}, solo_requests, warmup=1).values("solo")
    batched_seconds = timed(all_batched).wall
    solo.close()

    counted_before, errors_before = _server_count(base_url, token)
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(
            target=_client_process,
            args=(base_url, token, job_id, p, concurrency, max_tokens, deadline, go, results),
            daemon=True,
        )
        for p in range(processes)
    ]
    for w in workers:
        w.start()
    time.sleep(0.5)  # let the processes import and connect before the start signal
    started = time.perf_counter()
    go.set()
    records: list[dict[str, Any]] = []
    finished: set[int] = set()
    end = time.monotonic() + deadline
    while len(finished) < processes and time.monotonic() < end:
        try:
            process, part = results.get(timeout=max(0.1, min(5.0, end - time.monotonic())))
        except Exception:
            if not any(w.is_alive() for w in workers) and results.empty():
                break
            continue
        finished.add(process)
        records.extend(part)
    wall = time.perf_counter() - started
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():  # past the deadline: its requests count as lost
            w.kill()
            w.join(timeout=5)
    counted_after, errors_after = _server_count(base_url, token)

    sent = processes * concurrency
    seen: dict[tuple[int, int], int] = {}
    for r in records:
        key = (r["process"], r["index"])
        seen[key] = seen.get(key, 0) + 1
    answered = [r for r in records if r["ok"]]
    latencies = [r["seconds"] for r in answered]
    solo_p50 = statistics.median(solo_seconds) if solo_seconds else float("nan")
    p50 = _percentile(latencies, 0.50)
    return {
        "processes": processes,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "sent": sent,
        "answered": len(answered),
        "failed": [r for r in records if not r["ok"]][:10],
        "failed_count": sum(1 for r in records if not r["ok"]),
        "duplicates": sum(c - 1 for c in seen.values() if c > 1),
        "lost": sent - len(seen),
        "server_counted": counted_after - counted_before,
        "server_errors": errors_after - errors_before,
        "wall_s": wall,
        "throughput_rps": len(answered) / wall if wall > 0 else float("nan"),
        "p50_s": p50,
        "p99_s": _percentile(latencies, 0.99),
        "max_s": max(latencies) if latencies else float("nan"),
        "solo_p50_s": solo_p50,
        "p50_over_solo": p50 / solo_p50 if solo_p50 > 0 else float("nan"),
        "batched_s": batched_seconds,
        "wall_over_batched": wall / batched_seconds if batched_seconds > 0 else float("nan"),
    }


def run(processes: int = 8, concurrency: int = 50, max_tokens: int = 8) -> dict[str, Any]:
    """Start a server with one sampling job on the tiny model, drive the load, shut down."""
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.testing import build_tiny_model, free_port

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    port = free_port()
    config = loopback_config(model, port, sampling_gpus=1)
    client = ArcticRLClient(config, progress=False)
    try:
        token = (Path(client.backend.run_dir) / "token").read_text().strip()  # type: ignore[attr-defined]
        job_id = int(client.job_ids["sampling"])  # type: ignore[arg-type]
        return drive(
            f"http://127.0.0.1:{port}",
            token,
            job_id,
            processes=processes,
            concurrency=concurrency,
            max_tokens=max_tokens,
        )
    finally:
        client.shutdown()


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows for ``python -m bench``."""
    n = f"{result['processes']} x {result['concurrency']} generate"
    return [
        (
            f"load {n}: answered / sent",
            f"{result['answered']} / {result['sent']} (lost {result['lost']}, "
            f"duplicates {result['duplicates']}, server counted {result['server_counted']})",
            f"{result['throughput_rps']:.1f} req/s",
        ),
        (
            f"load {n}: latency p50 / p99",
            f"{result['p50_s'] * 1000:.0f} ms / {result['p99_s'] * 1000:.0f} ms",
            f"p50 {result['p50_over_solo']:.1f}x a lone request "
            f"({result['solo_p50_s'] * 1000:.0f} ms)",
        ),
        (
            f"load {n}: wall time vs the same prompts in one request",
            f"{result['wall_s']:.2f} s vs {result['batched_s']:.2f} s",
            f"{result['wall_over_batched']:.1f}x",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    result = run(args.processes, args.concurrency, args.max_tokens)
    lines = ["| benchmark | measured | ratio |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows(result)]
    (HERE / "load_results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(result, indent=2))
    return 0 if result["answered"] == result["sent"] and result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
