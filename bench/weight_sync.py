"""Weight-sync throughput: WeightSyncCoordinator vs a bare broadcast of one flat tensor.

Both move the same bytes between two processes in one run (gloo on CPU, NCCL on CUDA):
the baseline is ``torch.distributed.broadcast`` of one flat tensor; ours sends a mix that
packs a quarter of its bytes (3/4 in 4 MiB tensors, sent without copies; 1/4 in 256 KiB
tensors, packed into buckets) through the coordinator at bucket sizes 16/64/256 MiB, and a
mix with the shapes of a Llama-style model (almost nothing to pack) at the default bucket
size, with the pair worlds
and buffers kept between syncs as a worker keeps them. The variants alternate within each
repetition, the order reversed every other one (``bench.timing.paired``; the slower side of
the pair times a transfer); GB/s from the median time, and
the ratio as the median over repetitions of flat time / our time in the same repetition.

The cross-node case (``run_cross_node``, needs root) does the same between two "hosts" of
this machine: two network namespaces joined by a bridge (``tests/multinode/netns_cluster.py``),
the sender in one and the receiver in the other, each on its own 198.18.0.0/15 address. The
baseline is a gloo broadcast of one flat tensor between the same two processes; ours is the
Llama-shaped mix through the coordinator (default buckets, the pair's store on the sender's
address, a pair secret), alternating within each repetition.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.timing import Paired, paired

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent
CROSS_PORTS = {"flat": 29500, "ws": 29600}  # free: each namespace has its own port space


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


def _llama_like(total_bytes: int, device: str) -> list[tuple[str, Any]]:
    """The shapes of a Llama-style model (hidden 2048, MLP 5632, GQA 8:1) to the same total:
    layers of big matrices plus two 8 KiB norms each, the rest in an embedding; well under
    1 % of the bytes are in tensors small enough to be packed."""
    import torch

    g = torch.Generator().manual_seed(1)
    h, inter = 2048, 5632
    layer = {
        "self_attn.q_proj.weight": (h, h),
        "self_attn.k_proj.weight": (h // 8, h),
        "self_attn.v_proj.weight": (h // 8, h),
        "self_attn.o_proj.weight": (h, h),
        "mlp.gate_proj.weight": (inter, h),
        "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    per_layer = sum(torch.Size(s).numel() for s in layer.values())
    total = total_bytes // 4
    layers = max(0, (total - h) // per_layer)
    out = []
    for i in range(layers):
        for name, shape in layer.items():
            out.append((f"model.layers.{i}.{name}", torch.randn(shape, generator=g).to(device)))
    rest = total - layers * per_layer
    out.append(("model.embed_tokens.weight", torch.randn(rest, generator=g).to(device)))
    return out


def _side(
    role: str,
    total_bytes: int,
    bucket_sizes: list[int],
    ports: dict[str, int],
    device: str,
    reps: int,
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    from arctic_platform.rl.config import WeightSyncConfig
    from arctic_platform.rl.weight_sync.buffers import BufferCache
    from arctic_platform.rl.weight_sync.channels import ChannelCache
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
    llama = _llama_like(total_bytes, device) if rank == 0 else None
    nbytes = sum(t.numel() * t.element_size() for _, t in weights) if weights else 0
    nbytes_t = torch.tensor([nbytes], device=device)
    dist.broadcast(nbytes_t, 0)
    nbytes = int(nbytes_t.item())
    flat = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # touched: no faults
    dist.broadcast(flat[: 1024 * 1024], 0)  # warm-up
    # kept buffers, as a long-lived worker keeps them: the receiver's one region serves
    # every variant; the sender's packing slots differ in size per variant, so one cache each
    cache = BufferCache()
    coords = {
        size: WeightSyncCoordinator(
            WeightSyncConfig(
                training_gpus=1, inference_replicas=1, base_port=ports["ws"] + i, bucket_size=size
            ),
            timeout=300,
            buffers=cache if rank == 1 else BufferCache(),
            channels=ChannelCache(),  # pair worlds kept between syncs, as a worker keeps them
        )
        for i, size in enumerate(bucket_sizes)
    }
    llama_coord = WeightSyncCoordinator(
        WeightSyncConfig(
            training_gpus=1, inference_replicas=1, base_port=ports["ws"] + len(bucket_sizes)
        ),  # default bucket size
        timeout=300,
        buffers=cache if rank == 1 else BufferCache(),
        channels=ChannelCache(),
    )

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()

        return call

    sides = {"flat": synced(lambda: dist.broadcast(flat, 0))}
    for size, coord in coords.items():
        sides[f"{size // MiB}"] = synced(_transfer(coord, rank, weights, device))
    sides["llama"] = synced(_transfer(llama_coord, rank, llama, device))
    # variants alternate within each repetition (the order reversed every other one), so a
    # busy moment on this shared machine hits all of them alike; both ends run the same order
    timing = paired(sides, reps, before=dist.barrier)
    results.put((role, {"bytes": nbytes, "timing": timing.model_dump()}))
    dist.destroy_process_group()


def _transfer(
    coord: Any, rank: int, weights: list[tuple[str, Any]] | None, device: str
) -> Callable[[], Any]:
    """One sync through ``coord``: the sender sends the next version, the receiver receives."""
    versions = itertools.count()
    if rank == 0:
        return lambda: coord.send(0, weights or [], version=next(versions))
    return lambda: coord.receive(0, 0, device=device)


def run(
    total_bytes: int = 1024 * MiB,
    bucket_mib: tuple[int, ...] = (16, 64, 256),
    device: str | None = None,
    reps: int = 7,
    cross_node: bool = True,
) -> dict[str, Any]:
    """Run both sides in two processes; returns GB/s per variant and ratios over flat (and
    the cross-node case's, or why it was skipped, under ``cross_node``)."""
    report = run_local(total_bytes, bucket_mib, device, reps)
    if cross_node:
        report["cross_node"] = run_cross_node(total_bytes, reps)
    return report


def run_local(
    total_bytes: int = 1024 * MiB,
    bucket_mib: tuple[int, ...] = (16, 64, 256),
    device: str | None = None,
    reps: int = 7,
) -> dict[str, Any]:
    """Both sides on this host's loopback: GB/s per variant and ratios over flat."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    from arctic_platform.rl.testing import free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    base = free_port()
    ports = {"flat": free_port(), "ws": base if base < 60000 else 40000}
    sizes = [m * MiB for m in bucket_mib]
    procs = [
        ctx.Process(target=_side, args=(role, total_bytes, sizes, ports, device, reps, results))
        for role in ("sender", "receiver")
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    nbytes = got["sender"]["bytes"]
    timing = _slowest(got)
    flat = timing.values("flat")
    report: dict[str, Any] = {
        "device": device,
        "backend": "nccl" if device == "cuda" else "gloo",
        "bytes": nbytes,
        "reps": reps,
        "flat_broadcast_gbps": nbytes / statistics.median(flat) / 1e9,
        "flat_broadcast_best_gbps": nbytes / min(flat) / 1e9,
        "buckets": {},
        "seconds_per_rep": {k: [round(t, 4) for t in timing.values(k)] for k in timing.sides},
    }
    for m in [*bucket_mib, "llama"]:
        ours = timing.values(str(m))
        key = f"{m} MiB" if m != "llama" else "Llama-shaped mix, default buckets"
        report["buckets"][key] = {
            "gbps": nbytes / statistics.median(ours) / 1e9,
            "best_gbps": nbytes / min(ours) / 1e9,
            # paired: each repetition's flat run against the same repetition's run of ours,
            # back to back, so a busy moment on this shared machine hits both
            "ratio_vs_flat": timing.ratio("flat", str(m)),
            "best_ratio_vs_flat": min(flat) / min(ours),
        }
    return report


def _slowest(got: dict[str, Any]) -> Paired:
    """Both ends' timings as one: a transfer takes as long as its slower end."""
    ends = [Paired.model_validate(got[role]["timing"]) for role in ("sender", "receiver")]
    return Paired.slowest(ends)


def _coordinator_kwargs(role: str, sender_ip: str, own_ip: str) -> dict[str, Any]:
    """Each side's own address (its gloo device binds there); the receiver reaches the
    sender's pair store at ``sender_hosts[0]``; a pair secret, as the server runs it."""
    kwargs: dict[str, Any] = {"host": own_ip, "secret": "bench-" + "0" * 58}
    if role == "receiver":
        kwargs["sender_hosts"] = {0: sender_ip}
    return kwargs


def _cross_side(role: str, total_bytes: int, sender_ip: str, own_ip: str, reps: int) -> None:
    """One side of the cross-node case, run inside its namespace; prints a RESULT line."""
    import torch
    import torch.distributed as dist

    from arctic_platform.rl.config import WeightSyncConfig
    from arctic_platform.rl.weight_sync.buffers import BufferCache
    from arctic_platform.rl.weight_sync.channels import ChannelCache
    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    torch.set_num_threads(1)
    rank = 0 if role == "sender" else 1
    # the baseline's gloo device comes from GLOO_SOCKET_IFNAME (the namespace's eth0)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{sender_ip}:{CROSS_PORTS['flat']}",
        rank=rank,
        world_size=2,
    )
    weights = _llama_like(total_bytes, "cpu") if rank == 0 else None
    nbytes_t = torch.tensor([sum(t.numel() * 4 for _, t in weights) if weights else 0])
    dist.broadcast(nbytes_t, 0)
    nbytes = int(nbytes_t.item())
    flat = torch.ones(nbytes // 4, dtype=torch.float32)  # touched: no faults
    dist.broadcast(flat[: 1024 * 1024], 0)  # warm-up
    coord = WeightSyncCoordinator(
        WeightSyncConfig(training_gpus=1, inference_replicas=1, base_port=CROSS_PORTS["ws"]),
        timeout=300,
        buffers=BufferCache(),
        channels=ChannelCache(),  # pair world kept between syncs, as a worker keeps it
        **_coordinator_kwargs(role, sender_ip, own_ip),
    )

    sides = {
        "flat": lambda: dist.broadcast(flat, 0),
        "ours": _transfer(coord, rank, weights, "cpu"),
    }
    timing = paired(sides, reps, before=dist.barrier)
    result = {"role": role, "bytes": nbytes, "timing": timing.model_dump()}
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def run_cross_node(total_bytes: int = 1024 * MiB, reps: int = 7) -> dict[str, Any]:
    """Sender and receiver in two network namespaces: coordinator vs flat gloo broadcast.

    Returns GB/s of both and the paired ratio, or ``{"skipped": reason}`` where this machine
    cannot make namespaces (not root, no ``ip``).
    """
    sys.path.insert(0, str(REPO / "tests" / "multinode"))
    from netns_cluster import NetnsCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": reason}
    got: dict[str, Any] = {}
    with NetnsCluster(workers=1, ray=False) as cluster:
        sender, receiver = cluster.hosts
        env = {**cluster.env, "GLOO_SOCKET_IFNAME": sender.ifname, "PYTHONPATH": str(REPO)}
        procs = {}
        for role, host in (("sender", sender), ("receiver", receiver)):
            argv = [cluster.python, "-m", "bench.weight_sync", "--cross-side", role]
            argv += [f"--bytes={total_bytes}", f"--reps={reps}", f"--sender-ip={sender.ip}"]
            argv += [f"--own-ip={host.ip}"]
            err = open(cluster.run_dir / f"{role}.err", "w")
            procs[role] = (
                cluster.run_in(host, argv, env, cwd=REPO, stdout=subprocess.PIPE, stderr=err),
                err,
            )
        for role, (proc, err) in procs.items():
            out, _ = proc.communicate(timeout=3600)
            err.close()
            lines = [x for x in out.decode().splitlines() if x.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                tail = (cluster.run_dir / f"{role}.err").read_text()[-3000:]
                raise RuntimeError(f"cross-node {role} exited with {proc.returncode}:\n{tail}")
            got[role] = json.loads(lines[-1][len("RESULT ") :])

    timing = _slowest(got)
    flat, ours = timing.values("flat"), timing.values("ours")
    nbytes = got["sender"]["bytes"]
    return {
        "link": "veth pair + bridge between two network namespaces",
        "backend": "gloo",
        "bytes": nbytes,
        "reps": reps,
        "flat_broadcast_gbps": nbytes / statistics.median(flat) / 1e9,
        "coordinator_gbps": nbytes / statistics.median(ours) / 1e9,
        "ratio_vs_flat": timing.ratio("flat", "ours"),
        "best_ratio_vs_flat": min(flat) / min(ours),
        "seconds_per_rep": {
            "flat": [round(t, 4) for t in flat],
            "ours": [round(t, 4) for t in ours],
        },
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    size = f"{report['bytes'] / MiB:.0f} MiB"
    out = [
        (
            f"weight sync: flat {report['backend']} broadcast, {size} (baseline)",
            f"{report['flat_broadcast_gbps']:.2f} GB/s",
            "1.00",
        )
    ]
    for bucket, r in report["buckets"].items():
        out.append(
            (
                f"weight sync: coordinator, {bucket}{' buckets' * bucket.endswith('MiB')}, {size}",
                f"{r['gbps']:.2f} GB/s",
                f"{r['ratio_vs_flat']:.2f}",
            )
        )
    return out + cross_rows(report.get("cross_node"))


def cross_rows(cross: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """Markdown-table rows of the cross-node case (none when it did not run)."""
    if not cross or "skipped" in cross:
        return []
    size = f"{cross['bytes'] / MiB:.0f} MiB"
    return [
        (
            f"weight sync across namespaces: flat gloo broadcast, {size} (baseline)",
            f"{cross['flat_broadcast_gbps']:.2f} GB/s",
            "1.00",
        ),
        (
            f"weight sync across namespaces: coordinator, Llama-shaped mix, {size}",
            f"{cross['coordinator_gbps']:.2f} GB/s",
            f"{cross['ratio_vs_flat']:.2f}",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024, help="total MiB of float32 weights")
    parser.add_argument("--device", default=None)
    parser.add_argument("--reps", type=int, default=7, help="alternating repetitions")
    parser.add_argument("--case", choices=("all", "local", "cross-node"), default="all")
    # internal: one side of the cross-node case, started inside its namespace
    parser.add_argument("--cross-side", choices=("sender", "receiver"), help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sender-ip", help=argparse.SUPPRESS)
    parser.add_argument("--own-ip", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cross_side:
        _cross_side(args.cross_side, args.bytes, args.sender_ip, args.own_ip, args.reps)
    elif args.case == "cross-node":
        print(json.dumps(run_cross_node(args.mib * MiB, reps=args.reps), indent=2))
    else:
        result = run(args.mib * MiB, device=args.device, reps=args.reps)
        if args.case == "local":
            result.pop("cross_node", None)
        print(json.dumps(result, indent=2))
