"""``PairChannel``/``ChannelCache``: the pair worlds (TCP store + process group) of a sync,
kept alive between syncs so a sync pays no connection set-up.

The sender owns the store (master) on the pair's port; the receiver connects as a client
and names its channel with a fresh id. Each sync starts with the receiver's ``hello``
(channel id and sync number), so a sender whose peer rebuilt its channel sees a new id and
builds a new process group; a receiver whose cached store connection died rebuilds and says
hello again. Either side drops its channel after any failed sync.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PairChannel:
    """One side of a pair world on one port."""

    port: int
    master: bool
    store: Any
    channel_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # the receiver's id
    seq: int = 0  # the receiver's next sync number
    pg: Any = None
    pg_key: tuple[str, str] | None = None  # (receiver channel id, device type) the pg serves
    pg_count: int = 0

    def close(self) -> None:
        """Drop the process group, then the store (a sender's store stops listening)."""
        self.pg = None
        self.pg_key = None
        self.store = None


class ChannelCache:
    """Pair channels by (port, side), kept between syncs of one process (a worker)."""

    def __init__(self) -> None:
        self._channels: dict[tuple[int, bool], PairChannel] = {}
        self._lock = threading.Lock()

    def take(self, port: int, master: bool) -> PairChannel | None:
        """The kept channel for ``port`` and side, removed from the cache while in use."""
        with self._lock:
            return self._channels.pop((port, master), None)

    def peek(self, port: int, master: bool) -> PairChannel | None:
        """The kept channel for ``port`` and side, left in the cache."""
        with self._lock:
            return self._channels.get((port, master))

    def put(self, channel: PairChannel) -> None:
        """Keep ``channel`` for the next sync (after a successful one)."""
        with self._lock:
            old = self._channels.pop((channel.port, channel.master), None)
            self._channels[(channel.port, channel.master)] = channel
        if old is not None and old is not channel:
            old.close()

    def retain(self, ports: Iterable[int]) -> None:
        """Close kept channels on ports this sync does not use (the topology changed)."""
        keep = set(ports)
        with self._lock:
            stale = [k for k in self._channels if k[0] not in keep]
            dropped = [self._channels.pop(k) for k in stale]
        for channel in dropped:
            channel.close()

    def ports(self) -> list[int]:
        """Ports with a kept channel."""
        with self._lock:
            return sorted({port for port, _ in self._channels})

    def clear(self) -> None:
        """Close every kept channel."""
        with self._lock:
            dropped = list(self._channels.values())
            self._channels.clear()
        for channel in dropped:
            channel.close()
