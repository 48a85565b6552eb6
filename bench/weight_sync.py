"""Weight-sync throughput: WeightSyncCoordinator vs a bare broadcast of one flat tensor.

Both move the same bytes between two processes in one run (gloo on CPU, NCCL on CUDA):
the baseline is ``torch.distributed.broadcast`` of one flat tensor; ours sends ~4 MiB
tensors through the coordinator at bucket sizes 16/64/256 MiB. Reports GB/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import time
from typing import Any

MiB = 1024 * 1024


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _weights(total_bytes: int, device: str) -> list[tuple[str, Any]]:
    """A model-like mix: 3/4 of the bytes in 4 MiB matrices (sent without copies), 1/4 in
    256 KiB tensors (packed into buckets)."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    big, small = 4 * MiB // 4, 256 * 1024 // 4  # float32 elements
    for i in range(max(1, total_bytes * 3 // 4 // (big * 4))):
        out.append((f"layer.{i}.mlp.weight", torch.randn(big, generator=g).to(device)))
    for i in range(max(1, total_bytes // 4 // (small * 4))):
        out.append((f"layer.{i}.norm.weight", torch.randn(small, generator=g).to(device)))
    return out


def _side(
    role: str,
    total_bytes: int,
    bucket_sizes: list[int],
    ports: dict[str, int],
    device: str,
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    from arctic_platform.rl.config import WeightSyncConfig
    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    torch.set_num_threads(1)
    rank = 0 if role == "sender" else 1
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports["flat"]))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, rank=rank, world_size=2)
    weights = _weights(total_bytes, device) if rank == 0 else None
    nbytes = sum(t.numel() * t.element_size() for _, t in weights) if weights else 0
    nbytes_t = torch.tensor([nbytes], device=device)
    dist.broadcast(nbytes_t, 0)
    nbytes = int(nbytes_t.item())
    flat = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    out: dict[str, Any] = {"bytes": nbytes}
    dist.broadcast(flat[: 1024 * 1024], 0)  # warm-up
    times = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(flat, 0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out["flat_seconds"] = min(times)
    for i, size in enumerate(bucket_sizes):
        cfg = WeightSyncConfig(
            training_gpus=1, inference_replicas=1, base_port=ports["ws"] + i, bucket_size=size
        )
        coord = WeightSyncCoordinator(cfg, timeout=300, reuse_buffers=True)
        best = None
        for rep in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                coord.send(0, weights or [], version=rep)
            else:
                coord.receive(0, 0, device=device)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        out[f"bucket_{size // MiB}MiB_seconds"] = best
    results.put((role, out))
    dist.destroy_process_group()


def run(
    total_bytes: int = 1024 * MiB,
    bucket_mib: tuple[int, ...] = (16, 64, 256),
    device: str | None = None,
) -> dict[str, Any]:
    """Run both sides in two processes; returns GB/s per variant and ratios over flat."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    base = _port()
    ports = {"flat": _port(), "ws": base if base < 60000 else 40000}
    sizes = [m * MiB for m in bucket_mib]
    procs = [
        ctx.Process(target=_side, args=(role, total_bytes, sizes, ports, device, results))
        for role in ("sender", "receiver")
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    sender = got["sender"]
    nbytes = sender["bytes"]
    flat_gbps = nbytes / sender["flat_seconds"] / 1e9
    report: dict[str, Any] = {
        "device": device,
        "backend": "nccl" if device == "cuda" else "gloo",
        "bytes": nbytes,
        "flat_broadcast_gbps": flat_gbps,
        "buckets": {},
    }
    for m in bucket_mib:
        seconds = max(sender[f"bucket_{m}MiB_seconds"], got["receiver"][f"bucket_{m}MiB_seconds"])
        gbps = nbytes / seconds / 1e9
        report["buckets"][f"{m} MiB"] = {"gbps": gbps, "ratio_vs_flat": gbps / flat_gbps}
    return report


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    out = [
        (
            "weight sync: flat broadcast (baseline)",
            f"{report['flat_broadcast_gbps']:.2f} GB/s ({report['backend']})",
            "1.00",
        )
    ]
    for size, r in report["buckets"].items():
        out.append(
            (
                f"weight sync: coordinator, {size} buckets",
                f"{r['gbps']:.2f} GB/s",
                f"{r['ratio_vs_flat']:.2f}",
            )
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024, help="total MiB of float32 weights")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.mib * MiB, device=args.device), indent=2))
