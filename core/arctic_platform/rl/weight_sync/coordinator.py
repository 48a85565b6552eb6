"""``WeightSyncCoordinator``: moves full weights from training ranks to inference workers.

Each (sender, target) pair of the ``TransferSchedule`` meets on its own port: a TCP store
carries the bucket plan and the acknowledgements, a world-of-two process group (gloo on
CPU, NCCL for CUDA tensors) carries the bytes, double-buffered so packing bucket k+1 overlaps
sending bucket k. Colocated pairs move the bytes through a shared-memory file instead.
Every wait has a timeout and a message naming the side that did not arrive; a receiver
hands out tensors only after every bucket arrived, so a failed sync changes nothing. With a
``ChannelCache`` the pair worlds outlive a sync (see ``channels.py``), with a
``BufferCache`` the packing and receive buffers do.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.config import WeightSyncConfig
from arctic_platform.rl.weight_sync.buckets import (
    Bucket,
    Expected,
    WeightMismatchError,
    WeightSyncError,
    check_plan,
    direct_view,
    pack,
    plan_buckets,
    plan_from_json,
    plan_to_json,
    unpack,
)
from arctic_platform.rl.weight_sync.buffers import BufferCache
from arctic_platform.rl.weight_sync.channels import ChannelCache, PairChannel
from arctic_platform.rl.weight_sync.pair_auth import PairAuth, StrayPeerError
from arctic_platform.rl.weight_sync.schedule import Transfer, TransferSchedule
from arctic_platform.rl.weight_sync.sharding import ShardFn
from arctic_platform.rl.weight_sync.sharding import llama_tp_shard as llama_tp_shard  # old home

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


@dataclass
class SyncReport:
    """What one side of a sync moved: bytes, buckets, seconds and bandwidth."""

    version: int
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    targets: list[tuple[int, int]] = field(default_factory=list)
    reused: int = 0  # pairs whose store and process group were kept from the last sync

    @property
    def bandwidth_gbps(self) -> float:
        """Bytes per second over all targets, in GB/s (1e9)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "bytes": self.bytes,
            "buckets": self.buckets,
            "seconds": self.seconds,
            "bandwidth_gbps": self.bandwidth_gbps,
            "targets": [list(t) for t in self.targets],
            "reused": self.reused,
        }


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _listen(host: str, port: int) -> int:
    """A socket listening on ``host:port`` only, as a file descriptor the store takes over."""
    from arctic_platform.rl.network import listening_socket

    return listening_socket(host, port, 16).detach()


def _await_listener(host: str, port: int, deadline: float) -> None:
    """Return once something accepts connections on ``host:port``; raise at ``deadline``
    (the probe never connects to itself, which would take the port from the sender)."""
    from arctic_platform.rl.network import accepts_connections

    while not accepts_connections(host, port, max(0.01, min(1.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listened on {host}:{port}")
        time.sleep(0.005)


class WeightSyncCoordinator:
    """One coordinator per process; call ``send`` on training ranks, ``receive`` on targets.

    ``host`` is this process's own address: a sender's pair stores listen there and gloo
    binds there. A receiver reaches sender rank ``r`` at ``sender_hosts[r]`` (default
    ``host``: all on one node). With ``secret`` both sides of a pair prove they hold it and
    a stray connection to a pair's port is refused (see ``pair_auth.py``).
    """

    def __init__(
        self,
        config: WeightSyncConfig,
        *,
        timeout: float = 60.0,
        host: str = "127.0.0.1",
        sender_hosts: Mapping[int, str] | None = None,
        secret: str | None = None,
        shared_memory: bool = False,
        shm_dir: str | Path = "/dev/shm",
        reuse_buffers: bool = False,
        buffers: BufferCache | None = None,
        channels: ChannelCache | None = None,
    ) -> None:
        self.config = config
        self.schedule = TransferSchedule.from_config(config)
        self.timeout = timeout
        self.host = host
        self.sender_hosts = dict(sender_hosts or {})
        self.secret = secret
        self.shared_memory = shared_memory
        self.shm_dir = Path(shm_dir)
        # kept packing/receive buffers (``reuse_buffers`` or a cache shared across syncs)
        self.buffers = (
            buffers if buffers is not None else (BufferCache() if reuse_buffers else None)
        )
        # pair worlds kept between syncs (None: each sync builds and closes its own)
        self.channels = channels

    # --- sender -------------------------------------------------------------------------

    def send(
        self, rank: int, weights: Iterable[tuple[str, torch.Tensor]], version: int = 0
    ) -> SyncReport:
        """Send the full tensors of ``weights`` to this rank's targets.

        Every training rank calls this with the same stream (consuming it keeps fsdp/ZeRO-3
        gathers in step); a rank with no target only consumes it.
        """
        transfers = self.schedule.for_sender(rank)
        if self.channels is not None:
            self.channels.retain(t.port for t in transfers)
        report = SyncReport(version)
        started = time.monotonic()
        named = [(name, t.detach()) for name, t in weights]
        if not transfers:
            return report
        buckets = plan_buckets(named, self.config.bucket_size)
        tensors = dict(named)
        plan = plan_to_json(buckets, version)
        if len(transfers) == 1:
            report.reused = int(self._send_one(transfers[0], buckets, tensors, plan, 0))
        else:  # one thread per target: each pair is its own world, they do not wait on each other
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(transfers)) as pool:
                futures = [
                    pool.submit(self._send_one, t, buckets, tensors, plan, i)
                    for i, t in enumerate(transfers)
                ]
                report.reused = sum(int(future.result()) for future in futures)
        for transfer in transfers:
            report.targets.append(transfer.target)
            report.bytes += sum(b.nbytes for b in buckets)
            report.buckets += len(buckets)
        report.seconds = time.monotonic() - started
        return report

    def _store_host(self, transfer: Transfer, master: bool) -> str:
        """Where the pair's store listens: the sender's node address."""
        return self.host if master else self.sender_hosts.get(transfer.sender, self.host)

    def _open_store(self, transfer: Transfer, master: bool) -> Any:
        from torch.distributed import TCPStore

        side = "sender" if master else "receiver"
        host = self._store_host(transfer, master)
        fd: int | None = None
        try:
            if not master:
                # wait for the sender's store to listen before connecting: TCPStore's own
                # retry backs off for ~1 s, which dominated small syncs
                _await_listener(host, transfer.port, time.monotonic() + self.timeout)
            # torch's own store listens on every interface; ours only on ``host``
            fd = _listen(host, transfer.port) if master else None
            store = TCPStore(
                host,
                transfer.port,
                2,
                master,
                timeout=_timedelta(self.timeout),
                wait_for_workers=False,
                master_listen_fd=fd,
            )
            return store
        except Exception as exc:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
            peer = (
                f"the sender (training rank {transfer.sender})"
                if not master
                else f"port {transfer.port}"
            )
            raise WeightSyncError(
                f"{side} could not reach {peer} on {host}:{transfer.port} within "
                f"{self.timeout}s: {exc}"
            ) from None

    def _wait_key(
        self, store: Any, key: str, who: str, port: int, timeout: float | None = None
    ) -> str:
        limit = self.timeout if timeout is None else timeout
        try:
            store.wait([key], _timedelta(limit))
            return bytes(store.get(key)).decode()
        except Exception as exc:
            if isinstance(exc, WeightSyncError):
                raise
            raise WeightSyncError(
                f"{who} did not arrive on port {port} within {self.timeout}s ({key!r}: {exc})"
            ) from None

    def _wait_signed(self, store: Any, auth: PairAuth, key: str, who: str, port: int) -> str:
        """The value of ``key``, checked to come from the peer holding the secret."""
        return auth.check(key, self._wait_key(store, key, who, port))

    def _wait_hello(self, store: Any, auth: PairAuth, who: str, port: int) -> tuple[str, str]:
        """The receiver's channel id and sync number; hellos without the secret are dropped
        (a stray connection) and the wait goes on until the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WeightSyncError(
                    f"{who} did not arrive on port {port} within {self.timeout}s ('hello')"
                )
            raw = self._wait_key(store, "hello", who, port, timeout=left)
            store.delete_key("hello")
            try:
                channel_id, _, seq = auth.check("hello", raw).partition(":")
                return channel_id, seq
            except StrayPeerError as exc:
                logger.warning("%s", exc)

    def _send_one(
        self,
        transfer: Transfer,
        buckets: list[Bucket],
        tensors: dict[str, torch.Tensor],
        plan: str,
        index: int,
    ) -> bool:
        """One pair's transfer; True if it reused the kept pair world."""
        import torch

        target = f"the receiver (replica {transfer.replica}, tp_rank {transfer.tp_rank})"
        port = transfer.port
        auth = PairAuth(self.secret, port)
        kept = self.channels.take(port, True) if self.channels is not None else None
        channel = kept or PairChannel(port, True, self._open_store(transfer, master=True))
        store = channel.store
        shm_path: Path | None = None
        ok = False
        try:
            # the receiver opens each sync with its channel id and sync number
            channel_id, seq = self._wait_hello(store, auth, target, port)
            ns = f"{channel_id}/{seq}/"
            mode = "shm" if self.shared_memory else "pg"
            device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
            pg_prefix = "keep"
            if mode == "pg" and channel.pg_key != (channel_id, device.type):
                channel.pg, channel.pg_key = None, None  # its peer is gone: a new one
                channel.pg_count += 1
                pg_prefix = f"pg/{channel_id}/{channel.pg_count}"
            store.set(ns + "mode", auth.sign(ns + "mode", mode))
            store.set(ns + "pg", auth.sign(ns + "pg", pg_prefix))
            store.set(ns + "plan", auth.sign(ns + "plan", plan))
            ack = self._wait_signed(store, auth, ns + "ack", target, port)
            if ack != "ok":
                raise WeightMismatchError(f"{target} rejected the weights: {ack}")
            if mode == "shm":
                shm_path = self._write_shm(transfer, buckets, tensors)
                store.set(ns + "shm", auth.sign(ns + "shm", str(shm_path)))
            else:
                if pg_prefix != "keep":
                    channel.pg = self._process_group(
                        store, auth.group_name(pg_prefix), 0, device, target, port
                    )
                    channel.pg_key = (channel_id, device.type)
                self._send_buckets(channel.pg, buckets, tensors, device, target, f"pack{index}")
            done = self._wait_signed(store, auth, ns + "done", target, port)
            if done != "ok":
                raise WeightSyncError(f"{target} failed after receiving: {done}")
            for key in ("mode", "pg", "plan", "ack", "shm", "done"):
                store.delete_key(ns + key)
            ok = True
        finally:
            if shm_path is not None and shm_path.exists():
                shm_path.unlink(missing_ok=True)
            self._release(channel, ok)
        return kept is not None and (mode == "shm" or pg_prefix == "keep")

    def _release(self, channel: PairChannel, ok: bool) -> None:
        """Keep the channel for the next sync after a good one; close it otherwise."""
        if ok and self.channels is not None:
            self.channels.put(channel)
        else:
            channel.close()

    def _send_buckets(
        self,
        pg: Any,
        buckets: list[Bucket],
        tensors: dict[str, torch.Tensor],
        device: Any,
        target: str,
        use: str,
    ) -> None:
        """Send every bucket: big tensors straight from their memory, queued first so the wire
        stays busy while the rest are packed into two alternating buffers (packing one
        overlaps sending the other)."""
        direct = {b.index: direct_view(b, tensors) for b in buckets}
        packed = [b for b in buckets if direct[b.index] is None]
        # every send not yet waited on; each is waited on exactly once (a gloo send's
        # completion is consumed by the first wait: a second wait blocks until its timeout)
        in_flight: dict[int, Any] = {}
        for bucket in buckets:
            view = direct[bucket.index]
            if view is not None:
                in_flight[bucket.index] = pg.send([view], 1, bucket.index)
        largest = max((b.nbytes for b in packed), default=0)
        slots = min(2, len(packed))
        buffers = self._buffers(use, [largest] * slots, str(device))
        slot_owner: dict[int, int] = {}  # buffer slot -> the bucket whose send uses it
        for n, bucket in enumerate(packed):
            slot = n % slots
            previous = slot_owner.pop(slot, None)
            if previous is not None:
                self._wait_work(in_flight.pop(previous), target, previous)
            buf = pack(bucket, tensors, buffers[slot])
            in_flight[bucket.index] = pg.send([buf], 1, bucket.index)
            slot_owner[slot] = bucket.index
        for k, work in in_flight.items():
            self._wait_work(work, target, k)

    def _buffers(self, use: str, sizes: list[int], device: str) -> list[torch.Tensor]:
        """Kept buffers when this coordinator has a cache, else fresh ones."""
        if self.buffers is not None:
            return self.buffers.get(use, sizes, device)
        import torch

        return [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]

    def _wait_work(self, work: Any, who: str, bucket: int) -> None:
        try:
            ok = work.wait(_timedelta(self.timeout))
        except Exception as exc:
            raise WeightSyncError(f"moving bucket {bucket} to/from {who} failed: {exc}") from None
        if ok is False:
            raise WeightSyncError(f"bucket {bucket}: {who} did not finish within {self.timeout}s")

    def _process_group(
        self, store: Any, prefix: str, rank: int, device: Any, peer: str, port: int
    ) -> Any:
        try:
            return self._new_process_group(store, prefix, rank, device)
        except Exception as exc:
            raise WeightSyncError(
                f"{peer} did not join the transfer on port {port} within {self.timeout}s: {exc}"
            ) from None

    def _new_process_group(self, store: Any, prefix_name: str, rank: int, device: Any) -> Any:
        from torch.distributed import PrefixStore

        prefix = PrefixStore(prefix_name, store)
        if getattr(device, "type", "cpu") == "cuda":
            from torch.distributed.distributed_c10d import ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = _timedelta(self.timeout)
            return ProcessGroupNCCL(prefix, rank, 2, opts)
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = _timedelta(self.timeout)
        options._devices = [ProcessGroupGloo.create_device(hostname=self.host)]  # this host only
        return ProcessGroupGloo(prefix, rank, 2, options)

    def _write_shm(
        self, transfer: Transfer, buckets: list[Bucket], tensors: dict[str, torch.Tensor]
    ) -> Path:
        import torch

        self.shm_dir.mkdir(parents=True, exist_ok=True)
        total = sum(b.nbytes for b in buckets)
        final = self.shm_dir / f"arctic-rl-ws-{transfer.port}-{uuid.uuid4().hex}.bin"
        tmp = final.with_suffix(".tmp")
        region = torch.from_file(str(tmp), shared=True, size=max(total, 1), dtype=torch.uint8)
        offset = 0
        for bucket in buckets:
            pack(bucket, {k: v.cpu() for k, v in tensors.items()}, region[offset:])
            offset += bucket.nbytes
        del region
        os.replace(tmp, final)
        return final

    # --- receiver -----------------------------------------------------------------------

    def _receive_buffers(self, buckets: list[Bucket], device: str) -> list[torch.Tensor]:
        """One buffer per bucket; with a buffer cache the same ones serve every sync of the
        same plan (no page faults), so returned tensors are valid until the next receive."""
        return self._buffers("recv", [b.nbytes for b in buckets], device)

    def _hello(self, transfer: Transfer, sender: str, auth: PairAuth) -> tuple[PairChannel, str]:
        """Open this sync on the kept channel (or a new one): returns it and the key prefix.

        A kept channel whose sender went away fails its round trip at once (broken pipe);
        it is then rebuilt once against whatever listens on the port now."""
        port = transfer.port
        kept = self.channels.take(port, False) if self.channels is not None else None
        for channel in ([kept] if kept is not None else []) + [None]:
            if channel is None:
                channel = PairChannel(port, False, self._open_store(transfer, master=False))
            try:
                channel.store.add(f"{channel.channel_id}/alive", 1)  # a round trip
                ns = f"{channel.channel_id}/{channel.seq}/"
                channel.store.set(
                    "hello", auth.sign("hello", f"{channel.channel_id}:{channel.seq}")
                )
                channel.seq += 1
                return channel, ns
            except Exception as exc:
                channel.close()
                if channel is not kept:
                    raise WeightSyncError(
                        f"the receiver could not reach {sender} on port {port}: {exc}"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def receive(
        self,
        replica: int,
        tp_rank: int = 0,
        *,
        expected: Expected | None = None,
        shard: ShardFn | None = None,
        device: str = "cpu",
    ) -> tuple[list[tuple[str, torch.Tensor]], SyncReport]:
        """Receive this worker's weights; returns them only once every bucket arrived.

        ``expected`` (name -> (shape, dtype or None)) is checked against the plan before any
        bytes move; ``shard`` cuts each full tensor to this tp_rank's shard.
        """
        import torch

        transfer = self.schedule.for_target(replica, tp_rank)
        sender = f"the sender (training rank {transfer.sender})"
        port = transfer.port
        auth = PairAuth(self.secret, port)
        started = time.monotonic()
        if self.channels is not None:
            self.channels.retain([port])
        kept = self.channels.peek(port, False) if self.channels is not None else None
        channel, ns = self._hello(transfer, sender, auth)
        reused = kept is not None and channel is kept
        store = channel.store
        ok = False
        try:
            try:
                mode = self._wait_signed(store, auth, ns + "mode", sender, port)
                pg_prefix = self._wait_signed(store, auth, ns + "pg", sender, port)
                plan = self._wait_signed(store, auth, ns + "plan", sender, port)
            except StrayPeerError as exc:
                store.set(ns + "ack", auth.sign(ns + "ack", str(exc)))
                raise
            version, buckets = plan_from_json(plan)
            try:
                check_plan(buckets, expected)
            except WeightMismatchError as exc:
                store.set(ns + "ack", auth.sign(ns + "ack", str(exc)))
                raise
            store.set(ns + "ack", auth.sign(ns + "ack", "ok"))
            received: list[tuple[str, torch.Tensor]] = []
            try:
                if mode == "shm":
                    path = self._wait_signed(store, auth, ns + "shm", sender, port)
                    total = sum(b.nbytes for b in buckets)
                    region = torch.from_file(
                        path, shared=False, size=max(total, 1), dtype=torch.uint8
                    )
                    offset = 0
                    for bucket in buckets:
                        received.extend(unpack(bucket, region[offset : offset + bucket.nbytes]))
                        offset += bucket.nbytes
                else:
                    if pg_prefix != "keep":
                        channel.pg, channel.pg_key = None, None
                        channel.pg = self._process_group(
                            store, auth.group_name(pg_prefix), 1, torch.device(device), sender, port
                        )
                        channel.pg_key = (channel.channel_id, torch.device(device).type)
                    elif channel.pg is None:
                        raise WeightSyncError(
                            f"{sender} reused a transfer group this receiver does not have"
                        )
                    buffers = self._receive_buffers(buckets, device)
                    works = [
                        channel.pg.recv([buf], 0, b.index)
                        for b, buf in zip(buckets, buffers, strict=True)
                    ]
                    for bucket, work in zip(buckets, works, strict=True):
                        self._wait_work(work, sender, bucket.index)
                    for bucket, buf in zip(buckets, buffers, strict=True):
                        received.extend(unpack(bucket, buf))
                if shard is not None and self.config.inference_tp > 1:
                    received = [
                        (n, shard(n, t, tp_rank, self.config.inference_tp)) for n, t in received
                    ]
            except Exception as exc:
                try:
                    store.set(ns + "done", auth.sign(ns + "done", f"{type(exc).__name__}: {exc}"))
                except Exception:
                    pass
                raise
            store.set(ns + "done", auth.sign(ns + "done", "ok"))
            reused = reused and (mode == "shm" or pg_prefix == "keep")
            ok = True
        finally:
            self._release(channel, ok)
        nbytes = sum(b.nbytes for b in buckets)
        report = SyncReport(
            version, nbytes, len(buckets), time.monotonic() - started, [(replica, tp_rank)]
        )
        report.reused = int(reused)
        return received, report
