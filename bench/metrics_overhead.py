"""What metrics cost per operation: the same calls on two servers, metrics on and off, paired.

Two local servers run the same jobs (training and sampling on the tiny model, one logical
GPU each): one as started by default (every process records its metrics through Ray), one
with ``serve --no-metrics``. For each operation (fwd_bwd, step, generate, sync_weights and
the cheap ``get_job``, where the server's own cost is most of the call) the two are timed in
pairs, back to back in alternating order (``bench.timing.paired``); the ratio is the median
of the pairs' on/off time ratios (the issue's bound: at most 1.02), measured twice with the
servers started in either order and combined as a geometric mean.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from bench.servers import loopback_config, start_server, stop_server
from bench.timing import paired

BATCH = {
    "input_ids": [[1, 5, 6, 7, 8, 9, 10, 11] * 4, [1, 9, 10, 12] * 6] * 4,
    "advantages": [1.0, -1.0] * 4,
}
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11]]


def _server(root: Path, name: str, model: str, metrics: bool) -> tuple[Any, Any]:
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.testing import free_port

    port = free_port()
    args = ["serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--run-dir", str(root / name), "--num-gpus", "2", "--no-ray-auto-attach"]
    if not metrics:
        args.append("--no-metrics")
    server = start_server(
        args, health_url=f"http://127.0.0.1:{port}/health", log=root / f"{name}.log"
    )
    config = loopback_config(
        model,
        port,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=0,
        training_config={"optimizer": {"lr": 1e-4}},
    )
    return server, ArcticRLClient(config, progress=False)


def _measure(root: Path, model: str, first: str, repeats: int) -> dict[str, Any]:
    """Start both servers (``first`` first), time every operation in pairs, stop them."""
    started: dict[str, tuple[Any, Any]] = {}
    (root / f"{first}-first").mkdir(parents=True, exist_ok=True)
    try:
        for side in (first, "off" if first == "on" else "on"):
            started[side] = _server(root / f"{first}-first", side, model, metrics=side == "on")
        clients = {side: started[side][1] for side in ("on", "off")}
        operations = {
            "get_job": lambda c: c.job_info("training"),
            "fwd_bwd": lambda c: c.fwd_bwd(BATCH),
            "step": lambda c: c.step(),
            "generate": lambda c: c.generate(PROMPTS, {"n": 4, "max_tokens": 16, "seed": 1}),
            "sync_weights": lambda c: c.sync_weights(),
        }
        results: dict[str, Any] = {}
        for op, call in operations.items():
            sides = {side: (lambda c=client, f=call: f(c)) for side, client in clients.items()}
            calls = 20 if op == "get_job" else 1
            timing = paired(sides, repeats=repeats, warmup=2, calls=calls)
            results[op] = {
                "on_seconds": timing.median("on"),
                "off_seconds": timing.median("off"),
                "ratio": timing.ratio("on", "off"),
            }
        return results
    finally:
        for server, client in reversed(list(started.values())):
            client.shutdown()
            stop_server(server)


def run(repeats: int = 15) -> dict[str, Any]:
    """Each operation's on/off time ratio: the geometric mean over two runs that start the
    servers in either order (the second server started was up to 4 % slower here, whichever
    it was), and each run's figures."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from arctic_platform.rl.testing import build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="arctic-bench-metrics-"))
    os.environ["ARCTIC_RL_HOME"] = str(root / "home")
    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    runs = {first: _measure(root, model, first, repeats) for first in ("off", "on")}
    operations = {}
    for op in runs["off"]:
        a, b = runs["off"][op], runs["on"][op]
        operations[op] = {
            "on_seconds": (a["on_seconds"] + b["on_seconds"]) / 2,
            "off_seconds": (a["off_seconds"] + b["off_seconds"]) / 2,
            "ratio": (a["ratio"] * b["ratio"]) ** 0.5,
            "ratio_off_first": a["ratio"],
            "ratio_on_first": b["ratio"],
        }
    return {"benchmark": "metrics_overhead", "repeats": repeats, "operations": operations}


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio) per operation."""
    return [
        (
            f"metrics on vs off: {op}",
            f"{r['on_seconds'] * 1e3:.2f} ms vs {r['off_seconds'] * 1e3:.2f} ms",
            f"{r['ratio']:.3f} ({r['ratio_off_first']:.3f} / {r['ratio_on_first']:.3f})",
        )
        for op, r in report["operations"].items()
    ]


if __name__ == "__main__":  # pragma: no cover - a manual run
    import json
    import sys

    result = run(*(int(a) for a in sys.argv[1:2]))
    print(json.dumps(result, indent=2))
    for row in rows(result):
        print(" | ".join(row))
