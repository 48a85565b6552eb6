"""A weight-sync pair with a secret: a stray connection to the sender's port is refused and
never changes what the real receiver gets; a receiver without the secret gets nothing."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time

import pytest

from arctic_platform.rl.config import WeightSyncConfig
from arctic_platform.rl.network import free_port_range

pytestmark = pytest.mark.slow
SHAPES = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,)}


def _weights():
    import torch

    g = torch.Generator().manual_seed(7)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _send(cfg, secret, timeout, results):
    try:
        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

        coord = WeightSyncCoordinator(WeightSyncConfig(**cfg), timeout=timeout, secret=secret)
        report = coord.send(0, iter(_weights().items()), version=3)
        results.put(("sender", "ok", report.bytes))
    except Exception as exc:
        results.put(("sender", "error", f"{type(exc).__name__}: {exc}"))


def _receive(cfg, secret, timeout, results):
    try:
        import torch

        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

        coord = WeightSyncCoordinator(WeightSyncConfig(**cfg), timeout=timeout, secret=secret)
        received, _ = coord.receive(0)
        expected = _weights()
        exact = all(torch.equal(t, expected[n]) for n, t in received)
        results.put(("receiver", "ok", exact and len(received) == len(expected)))
    except Exception as exc:
        results.put(("receiver", "error", f"{type(exc).__name__}: {exc}"))


def _config() -> dict:
    return WeightSyncConfig(
        training_gpus=1, inference_replicas=1, base_port=free_port_range(1), bucket_size=4096
    ).model_dump()


def _collect(results, count, limit):
    out = {}
    deadline = time.monotonic() + limit
    while len(out) < count:
        try:
            side, status, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        out[side] = (status, value)
    return out


def _stray_hello(port: int, value: str) -> None:
    """What a stray process on the network can do: connect to the store, write a hello."""
    import datetime

    from torch.distributed import TCPStore

    deadline = time.monotonic() + 30
    while True:
        try:
            store = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=5))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    store.set("hello", value)
    while store.check(["hello"]):  # the sender has read it (and, without the secret, dropped it)
        if time.monotonic() > deadline:
            raise TimeoutError("the sender never read the stray hello")
        time.sleep(0.05)


def test_a_stray_hello_is_refused_and_the_real_receiver_gets_exact_weights():
    ctx = mp.get_context("spawn")
    cfg, results = _config(), ctx.Queue()
    secret = "a" * 64
    sender = ctx.Process(target=_send, args=(cfg, secret, 30.0, results))
    sender.start()
    _stray_hello(cfg["base_port"], "stray:0")  # no secret: dropped by the sender
    receiver = ctx.Process(target=_receive, args=(cfg, secret, 30.0, results))
    receiver.start()
    out = _collect(results, 2, 120)
    sender.join(30), receiver.join(30)
    assert out.get("receiver") == ("ok", True), out
    assert out.get("sender", ("?",))[0] == "ok", out


def test_a_receiver_without_the_secret_gets_nothing_and_both_sides_time_out():
    ctx = mp.get_context("spawn")
    cfg, results = _config(), ctx.Queue()
    sender = ctx.Process(target=_send, args=(cfg, "b" * 64, 8.0, results))
    receiver = ctx.Process(target=_receive, args=(cfg, "c" * 64, 8.0, results))
    sender.start()
    receiver.start()
    out = _collect(results, 2, 120)
    sender.join(30), receiver.join(30)
    assert out["receiver"][0] == "error", out
    assert out["sender"][0] == "error" and "did not arrive" in out["sender"][1], out
