"""What one more Tinker model costs the server: host memory and processes, per extra model.

Starts ``arctic-rl serve --transport tinker`` and, through the real SDK, creates ``models``
LoRA training clients of rank ``rank`` on the same base model, one after another; each takes
one optimizer step and opens a sampler on its weights (so its adapter is live in the sampler
too). After each model the server's whole process tree (the server, Ray's processes, every
engine worker) is measured: proportional set size summed over processes (PSS: shared pages
split between the processes that share them, so the sum is the tree's real footprint), and
the number of processes. The figure is the growth per extra model, after the first.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import stop_server
from bench.tinker import ADAM, _start_tinker_server

TOKEN = "tml-bench-key"


def tree_memory(pid: int) -> dict[str, float]:
    """PSS and RSS (MB) summed over ``pid`` and all its descendants, and how many they are."""
    import psutil

    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    pss = rss = 0.0
    count = 0
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += float(getattr(info, "pss", info.rss))
        rss += float(info.rss)
        count += 1
    return {"pss_mb": pss / 1e6, "rss_mb": rss / 1e6, "processes": float(count)}


def _one_step(training: Any, tokens: list[int]) -> None:
    """One cross-entropy step on a fixed row, so the model's weights move."""
    import tinker

    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "weights": [1.0] * (len(tokens) - 1),
        },
    )
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(tinker.AdamParams(**ADAM)).result()


def _create(service: Any, model: str, rank: int, timeout: float) -> Any:
    """``create_lora_training_client``, or None when the server has not placed it in time
    (its jobs wait for GPUs the earlier models hold). A daemon thread waits, so a model
    never placed does not keep this process alive."""
    import threading

    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            service.create_lora_training_client(base_model=model, rank=rank).result()
        ),
        daemon=True,
    )
    waiter.start()
    waiter.join(timeout)
    return got[0] if got else None


def _measure(models: int, rank: int, place_timeout: float, full: bool) -> dict[str, Any]:
    """The server tree's memory after each of ``models`` models (LoRA pools, or with
    ``full`` each model's own jobs: ``ARCTIC_RL_TINKER_FULL_FINE_TUNING=1``)."""
    import tinker
    from transformers import AutoTokenizer

    from arctic_platform.rl.testing import build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="arctic-bench-tinker-models-"))
    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    tokens = AutoTokenizer.from_pretrained(model).encode("12 + 30 = 42, 7 + 5 = 12")
    (root / "tinker").mkdir()
    env = {"ARCTIC_RL_TINKER_FULL_FINE_TUNING": "1" if full else "0"}
    server, url = _start_tinker_server(root / "tinker", env)
    after: list[dict[str, float]] = []
    is_lora, lora_rank, unplaced = None, None, None
    seconds: list[float] = []
    try:
        service = tinker.ServiceClient(base_url=url, api_key=TOKEN)
        baseline = tree_memory(server.pid)
        keep = []  # the clients stay alive: their models (and jobs) stay too
        for index in range(models):
            started = time.monotonic()
            training = _create(service, model, rank, place_timeout)
            if training is None:
                unplaced = index
                break
            _one_step(training, tokens)
            keep.append((training, training.save_weights_and_get_sampling_client()))
            seconds.append(time.monotonic() - started)
            time.sleep(2.0)  # let freed memory settle before reading the tree
            after.append(tree_memory(server.pid))
            info = training.get_info()
            is_lora, lora_rank = bool(info.is_lora), info.lora_rank
    finally:
        stop_server(server)
    growth = [b["pss_mb"] - a["pss_mb"] for a, b in itertools.pairwise(after)]
    procs = [b["processes"] - a["processes"] for a, b in itertools.pairwise(after)]
    first = after[0]["pss_mb"] - baseline["pss_mb"] if after else None
    return {
        "models": models,
        "unplaced_model": unplaced,
        "rank": rank,
        "is_lora": is_lora,
        "lora_rank": lora_rank,
        "baseline": baseline,
        "after_each_model": after,
        "seconds_per_model": seconds,
        "first_model_pss_mb": first,
        "first_model_processes": after[0]["processes"] - baseline["processes"] if after else None,
        "pss_mb_per_extra_model": sum(growth) / len(growth) if growth else None,
        "processes_per_extra_model": sum(procs) / len(procs) if procs else None,
    }


def run(models: int = 3, rank: int = 8, place_timeout: float = 300.0) -> dict[str, Any]:
    """What each more Tinker model costs a one-GPU server (as the Tinker tests run it): LoRA
    models (a pool: one training and one sampling job for all), then full fine-tuning (each
    model its own two jobs; a second one waits for a GPU that never frees)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lora = _measure(models, rank, place_timeout, full=False)
    full = _measure(2, rank, min(place_timeout, 120.0), full=True)
    return {"lora": lora, "full": full}


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The markdown rows of ``python -m bench`` (process counts are left out: Ray keeps idle
    workers that engines take over, so they do not show what a model starts)."""
    lora, full = report["lora"], report["full"]
    out = []
    if lora["pss_mb_per_extra_model"] is not None:
        out.append(
            (
                f"one more Tinker model, LoRA rank {lora['lora_rank']} (tiny model, one GPU)",
                f"+{lora['pss_mb_per_extra_model']:.1f} MB PSS (an adapter in the pool's jobs)",
                f"the first model (the pool's two jobs) took {lora['first_model_pss_mb']:.0f} MB",
            )
        )
    else:
        out.append(("one more Tinker model, LoRA", "not placed", "see the JSON"))
    if full["first_model_pss_mb"] is not None:
        placed = "not started" if full["unplaced_model"] is not None else "placed"
        out.append(
            (
                "one more Tinker model, full fine-tuning (tiny model, one GPU)",
                f"+{full['first_model_pss_mb']:.0f} MB PSS (its own training and sampling job)",
                f"a second model is {placed}: no room on the GPU the first one holds",
            )
        )
    return out


if __name__ == "__main__":  # pragma: no cover - a manual run
    import json

    result = run()
    print(json.dumps(result, indent=2))
    for row in rows(result):
        print(" | ".join(row))
