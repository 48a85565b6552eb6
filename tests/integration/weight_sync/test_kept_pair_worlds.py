"""Pair worlds kept between syncs: reused while both sides live, rebuilt after a receiver dies
mid-transfer or the sender process is replaced; every sync after a failure works."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback

import pytest

from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow
TIMEOUT = 10.0
SHAPES = {
    "model.embed_tokens.weight": (64, 32),
    "model.norm.weight": (32,),
    "model.layers.0.mlp.up_proj.weight": (48, 32),
}
SMALL_SHAPES = {f"model.layers.{i}.input_layernorm.weight": (256,) for i in range(6)}


def _weights(version: int):
    import torch

    g = torch.Generator().manual_seed(7 + version)
    shapes = {**SHAPES, **SMALL_SHAPES}
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


def _config(port: int):
    from arctic_platform.rl.config import WeightSyncConfig

    return WeightSyncConfig(training_gpus=1, inference_replicas=1, base_port=port, bucket_size=2048)


def _sender(port, commands, results, shm=False):
    """Sends the weights of each version it is given, keeping its pair worlds."""
    import torch

    from arctic_platform.rl.weight_sync.buffers import BufferCache
    from arctic_platform.rl.weight_sync.channels import ChannelCache
    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    torch.set_num_threads(1)
    channels, buffers = ChannelCache(), BufferCache()
    while (version := commands.get()) is not None:
        coord = WeightSyncCoordinator(
            _config(port), timeout=TIMEOUT, channels=channels, buffers=buffers, shared_memory=shm
        )
        try:
            report = coord.send(0, _weights(version).items(), version=version)
            results.put(("sender", version, "ok", report.reused))
        except Exception as exc:
            results.put(("sender", version, "error", f"{type(exc).__name__}: {exc}"))


def _receiver(port, commands, results, shm=False):
    """Receives each version it is given and checks it bit for bit; "die" crashes mid-way."""
    import torch

    from arctic_platform.rl.weight_sync.buffers import BufferCache
    from arctic_platform.rl.weight_sync.channels import ChannelCache
    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    torch.set_num_threads(1)
    channels, buffers = ChannelCache(), BufferCache()
    while (command := commands.get()) is not None:
        version, die = command
        coord = WeightSyncCoordinator(
            _config(port), timeout=TIMEOUT, channels=channels, buffers=buffers, shared_memory=shm
        )
        if die:  # joined the transfer and accepted the plan; no bucket has landed yet

            def crash(*_args, **_kwargs):
                os._exit(3)

            coord._receive_buffers = crash
        try:
            received, report = coord.receive(0, 0)
            want = _weights(version)
            bad = [n for n, t in received if not torch.equal(t, want[n])]
            if bad or len(received) != len(want):
                raise AssertionError(f"differs: {bad}")
            results.put(("receiver", version, "ok", report.reused))
        except Exception as exc:
            results.put(("receiver", version, "error", f"{exc}\n{traceback.format_exc()[-400:]}"))


class _Side:
    def __init__(self, ctx, target, port, results, shm=False):
        self.commands = ctx.Queue()
        self.process = ctx.Process(target=target, args=(port, self.commands, results, shm))
        self.process.start()

    def stop(self):
        self.commands.put(None)
        self.process.join(timeout=20)
        if self.process.is_alive():
            self.process.kill()


def _sync(results, sender, receiver, version, die=False, expect=2):
    sender.commands.put(version)
    receiver.commands.put((version, die))
    out = {}
    for _ in range(expect):
        try:
            kind, v, status, info = results.get(timeout=TIMEOUT * 4)
        except queue.Empty:
            break
        assert v == version
        out[kind] = (status, info)
    return out


def test_pair_worlds_are_kept_and_rebuilt_after_failures():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    sides: list[_Side] = []

    def sync(sender, receiver, version, die=False, expect=2):
        return _sync(results, sender, receiver, version, die, expect)

    try:
        s1 = _Side(ctx, _sender, port, results)
        r1 = _Side(ctx, _receiver, port, results)
        sides += [s1, r1]
        assert sync(s1, r1, 1) == {"sender": ("ok", 0), "receiver": ("ok", 0)}
        # second sync: both sides reuse the store and the process group
        assert sync(s1, r1, 2) == {"sender": ("ok", 1), "receiver": ("ok", 1)}
        # the receiver dies mid-transfer: the sender names it, within its timeouts
        out = sync(s1, r1, 3, die=True, expect=1)
        status, info = out["sender"]
        assert status == "error" and "receiver (replica 0, tp_rank 0)" in info, out
        # a new receiver process on the same port: the sender rebuilds its world
        r2 = _Side(ctx, _receiver, port, results)
        sides.append(r2)
        assert sync(s1, r2, 4) == {"sender": ("ok", 0), "receiver": ("ok", 0)}
        assert sync(s1, r2, 5) == {"sender": ("ok", 1), "receiver": ("ok", 1)}
        # the sender process is replaced: the receiver's kept connection is dead; it rebuilds
        s1.stop()
        s2 = _Side(ctx, _sender, port, results)
        sides.append(s2)
        assert sync(s2, r2, 6) == {"sender": ("ok", 0), "receiver": ("ok", 0)}
        assert sync(s2, r2, 7) == {"sender": ("ok", 1), "receiver": ("ok", 1)}
    finally:
        for side in sides:
            side.stop()


def test_shared_memory_pairs_are_kept_too():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    sides = [
        _Side(ctx, _sender, port, results, shm=True),
        _Side(ctx, _receiver, port, results, shm=True),
    ]
    try:
        assert _sync(results, *sides, 1) == {"sender": ("ok", 0), "receiver": ("ok", 0)}
        assert _sync(results, *sides, 2) == {"sender": ("ok", 1), "receiver": ("ok", 1)}
    finally:
        for side in sides:
            side.stop()


def _listen_report(role, port, results):
    """Sync once with kept pair worlds, then report this process's listening addresses."""
    import psutil
    import torch

    from arctic_platform.rl.weight_sync.channels import ChannelCache
    from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

    coord = WeightSyncCoordinator(_config(port), timeout=TIMEOUT, channels=ChannelCache())
    try:
        if role == "sender":
            coord.send(0, [("model.norm.weight", torch.ones(32))])
        else:
            coord.receive(0, 0)
        listening = [
            c.laddr.ip
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        results.put((role, "ok", listening))
    except Exception as exc:
        results.put((role, "error", repr(exc)))


def test_kept_pair_worlds_listen_on_loopback_only():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_listen_report, args=(role, port, results))
        for role in ("sender", "receiver")
    ]
    for p in procs:
        p.start()
    try:
        out = {}
        for _ in procs:
            role, status, info = results.get(timeout=TIMEOUT * 3)
            out[role] = (status, info)
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert out["sender"][0] == "ok" and out["sender"][1], out  # its store and gloo listen
    for _status, addresses in out.values():
        assert all(ip in ("127.0.0.1", "::1") for ip in addresses), out
