"""WeightSyncCoordinator across real processes on CPU (gloo): bit-exact, timeouts, recovery."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback

import pytest

from arctic_platform.rl.config import WeightSyncConfig

pytestmark = pytest.mark.slow
TIMEOUT = 20.0
SHAPES = {
    "model.embed_tokens.weight": (64, 32),
    "model.layers.0.self_attn.q_proj.weight": (32, 32),
    "model.layers.0.self_attn.o_proj.weight": (32, 32),
    "model.norm.weight": (32,),
    "lm_head.weight": (64, 32),
    "model.layers.0.mlp.up_proj.weight": (48, 32),
}


# many small tensors: with 4 KiB buckets they fill more packed buckets than there are
# packing buffers, so each buffer is reused (regression: a send was waited on twice and hung)
MANY_SMALL = {f"model.layers.{i}.input_layernorm.weight": (256,) for i in range(24)}


def _full_weights(version: int, shapes=None):
    import torch

    g = torch.Generator().manual_seed(1000 + version)
    return {n: torch.randn(s, generator=g) for n, s in (shapes or SHAPES).items()}


def _base_port(count: int) -> int:
    """A base port with ``count`` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65000:
            continue
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def _sender(rank, world, gather_port, cfg, version, results, shm=False, shapes=None):
    """An fsdp-style rank: holds half of every tensor, all-gathers, then sends."""
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(gather_port))
        import torch
        import torch.distributed as dist

        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        full = _full_weights(version, shapes)

        def gathered():
            for name, tensor in full.items():
                flat = tensor.reshape(-1)
                shard = flat.chunk(world)[rank].clone()  # what this rank holds
                parts = [torch.empty_like(shard) for _ in range(world)]
                dist.all_gather(parts, shard)
                yield name, torch.cat(parts).view(tensor.shape)

        coord = WeightSyncCoordinator(WeightSyncConfig(**cfg), timeout=TIMEOUT, shared_memory=shm)
        report = coord.send(rank, gathered(), version=version)
        results.put(("sender", rank, "ok", report.bytes))
        dist.destroy_process_group()
    except Exception as exc:
        results.put(("sender", rank, "error", f"{type(exc).__name__}: {exc}"))


def _receiver(replica, tp_rank, cfg, version, results, mode="normal", shm=False, shapes=None):
    try:
        import torch

        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator
        from arctic_platform.rl.weight_sync.sharding import llama_tp_shard

        torch.set_num_threads(1)
        coord = WeightSyncCoordinator(WeightSyncConfig(**cfg), timeout=TIMEOUT, shared_memory=shm)
        expected = {n: (s, "float32") for n, s in (shapes or SHAPES).items()}
        if mode == "wrong_shape":
            expected["model.norm.weight"] = ((16,), "float32")
        if mode == "die":
            # dies after accepting the plan and joining the transfer, before any bucket lands
            def crash(*_args, **_kwargs):
                os._exit(3)

            coord._receive_buffers = crash
        received, _report = coord.receive(replica, tp_rank, expected=expected, shard=llama_tp_shard)
        full = _full_weights(version, shapes)
        tp = cfg.get("inference_tp", 1)
        for name, tensor in received:
            want = llama_tp_shard(name, full[name], tp_rank, tp)
            if not torch.equal(tensor, want):
                raise AssertionError(f"{name} differs")
        results.put(("receiver", (replica, tp_rank), "ok", len(received)))
    except Exception as exc:
        results.put(
            (
                "receiver",
                (replica, tp_rank),
                "error",
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-500:]}",
            )
        )


def _run(cfg, senders, receivers, version=1, shm=False, receiver_modes=None, wait=90, shapes=None):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gather_port = _base_port(1)
    procs = [
        ctx.Process(
            target=_sender, args=(r, senders, gather_port, cfg, version, results, shm, shapes)
        )
        for r in range(senders)
    ]
    modes = receiver_modes or {}
    procs += [
        ctx.Process(
            target=_receiver,
            args=(rep, t, cfg, version, results, modes.get((rep, t), "normal"), shm, shapes),
        )
        for rep, t in receivers
    ]
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + wait
    expected = senders + sum(1 for k in receivers if modes.get(k) != "die")
    while len(out) < expected and time.monotonic() < deadline:
        try:
            kind, who, status, info = results.get(timeout=1)
            out[(kind, who)] = (status, info)
        except Exception:
            pass
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return out


def test_two_fsdp_ranks_to_two_replicas_bit_exact():
    cfg = {
        "training_sharding": "fsdp",
        "training_gpus": 2,
        "inference_replicas": 2,
        "base_port": _base_port(2),
        "bucket_size": 8 * 1024,
    }
    out = _run(cfg, 2, [(0, 0), (1, 0)])
    assert out[("receiver", (0, 0))][0] == "ok", out
    assert out[("receiver", (1, 0))][0] == "ok", out
    assert out[("receiver", (0, 0))][1] == len(SHAPES)
    assert out[("sender", 0)][0] == "ok" and out[("sender", 1)][0] == "ok"


def test_more_packed_buckets_than_buffers_completes():
    cfg = {
        "training_gpus": 1,
        "inference_replicas": 1,
        "base_port": _base_port(1),
        "bucket_size": 4096,
    }
    out = _run(cfg, 1, [(0, 0)], shapes=MANY_SMALL)
    assert out[("receiver", (0, 0))] == ("ok", len(MANY_SMALL)), out
    assert out[("sender", 0)][0] == "ok", out


def test_tp2_receivers_take_their_shard():
    cfg = {
        "training_sharding": "dp",
        "training_gpus": 1,
        "inference_replicas": 1,
        "inference_tp": 2,
        "base_port": _base_port(2),
    }
    out = _run(cfg, 1, [(0, 0), (0, 1)])
    assert out[("receiver", (0, 0))][0] == "ok", out
    assert out[("receiver", (0, 1))][0] == "ok", out


def test_shared_memory_path_is_bit_exact():
    cfg = {"training_gpus": 1, "inference_replicas": 1, "base_port": _base_port(1)}
    out = _run(cfg, 1, [(0, 0)], shm=True)
    assert out[("receiver", (0, 0))][0] == "ok", out


def test_shape_mismatch_is_an_error_naming_the_parameter_before_bytes_move():
    cfg = {"training_gpus": 1, "inference_replicas": 1, "base_port": _base_port(1)}
    out = _run(cfg, 1, [(0, 0)], receiver_modes={(0, 0): "wrong_shape"})
    status, info = out[("receiver", (0, 0))]
    assert status == "error" and "model.norm.weight" in info and "WeightMismatchError" in info
    status, info = out[("sender", 0)]
    assert status == "error" and "model.norm.weight" in info


def test_missing_receiver_times_out_naming_it():
    import torch

    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    cfg = WeightSyncConfig(training_gpus=1, inference_replicas=1, base_port=_base_port(1))
    coord = WeightSyncCoordinator(cfg, timeout=3.0)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"receiver \(replica 0, tp_rank 0\) did not arrive"):
        coord.send(0, [("w", torch.zeros(4))])
    assert time.monotonic() - started < 30


def test_receiver_dying_mid_transfer_is_a_clear_error_and_the_next_sync_works():
    port = _base_port(1)
    cfg = {"training_gpus": 1, "inference_replicas": 1, "base_port": port}
    out = _run(cfg, 1, [(0, 0)], receiver_modes={(0, 0): "die"})
    status, info = out[("sender", 0)]
    assert status == "error" and "receiver (replica 0, tp_rank 0)" in info
    out = _run(cfg, 1, [(0, 0)], version=2)
    assert out[("receiver", (0, 0))][0] == "ok", out
    assert out[("sender", 0)][0] == "ok", out
