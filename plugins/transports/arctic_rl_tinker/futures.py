"""Tinker's futures: every mutating call answers a request id the SDK polls with retrieve_future.

A ``Future`` is completed from a worker thread and awaited from the event loop (long-poll),
so a poll costs no thread while it waits. ``Lane`` runs one model's requests in ``seq_id``
order, whatever order they arrive in; ``Coalescer`` gathers requests that arrive together
(one sampler's samples) into one batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arctic_platform.rl.api import ArcticRLError, InvalidRequestError

logger = logging.getLogger(__name__)

MAX_KEPT = 4096
"""Completed futures kept for retrieval; the oldest are dropped beyond this."""


@dataclass
class Outcome:
    """A completed request: a JSON answer, protobuf bytes, or an error with its category."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"


def failure(exc: BaseException) -> Outcome:
    """An exception as a failed outcome: ``user`` for 4xx-class errors, else ``server``."""
    if isinstance(exc, ArcticRLError) and getattr(exc, "status", 500) < 500:
        return Outcome(error=str(exc), category="user")
    logger.warning("tinker request failed: %s: %s", type(exc).__name__, exc)
    return Outcome(error=f"{type(exc).__name__}: {exc}", category="server")


@dataclass
class Future:
    """One request's eventual outcome."""

    request_id: str
    outcome: Outcome | None = None
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, outcome: Outcome) -> None:
        """Complete the future (once) and wake every poll waiting on it."""
        with self._lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float) -> Outcome | None:
        """The outcome, or None if it is not ready within ``timeout`` seconds."""
        event = asyncio.Event()
        with self._lock:
            if self.outcome is not None:
                return self.outcome
            self._waiters.append((asyncio.get_running_loop(), event))
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        return self.outcome


class Futures:
    """Every request's future by request id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Future] = OrderedDict()
        self._ids = itertools.count(1)

    def new(self, kind: str) -> Future:
        """A fresh pending future with a unique id."""
        with self._lock:
            future = Future(f"{kind}-{next(self._ids)}")
            self._items[future.request_id] = future
            while len(self._items) > MAX_KEPT:
                oldest = next(iter(self._items.values()))
                if oldest.outcome is None:
                    break
                self._items.popitem(last=False)
            return future

    def get(self, request_id: str) -> Future | None:
        """The future of ``request_id``, if known."""
        with self._lock:
            return self._items.get(request_id)


def run_into(future: Future, work: Callable[[], Outcome]) -> None:
    """Run ``work`` and complete ``future`` with its outcome (or its exception)."""
    try:
        outcome = work()
    except BaseException as exc:
        outcome = failure(exc)
    future.set(outcome)


class Lane:
    """Runs one model's requests in ``seq_id`` order on a thread of its own."""

    def __init__(self, name: str, first_seq: int = 1) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._next = first_seq
        self._pending: dict[int, Callable[[], None]] = {}
        self._by_seq: dict[int, str] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"tinker-lane-{name}", daemon=True)
        self._thread.start()

    def known(self, seq_id: int) -> str | None:
        """The request id already given to ``seq_id`` (a resent request), if any."""
        with self._cond:
            return self._by_seq.get(seq_id)

    def submit(self, seq_id: int, request_id: str, work: Callable[[], None]) -> None:
        """Queue ``work`` to run once every lower ``seq_id`` has run."""
        with self._cond:
            if seq_id < self._next or seq_id in self._pending:
                raise InvalidRequestError(f"seq_id {seq_id} of model {self.name} was already used")
            self._by_seq[seq_id] = request_id
            self._pending[seq_id] = work
            self._cond.notify_all()

    def skip(self, seq_id: int) -> None:
        """Mark ``seq_id`` as used by a refused request, so later ones are not held up."""
        with self._cond:
            if seq_id >= self._next and seq_id not in self._pending:
                self._pending[seq_id] = lambda: None
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the lane's thread once its current request is done."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and self._next not in self._pending:
                    self._cond.wait()
                if self._stopped:
                    return
                work = self._pending.pop(self._next)
                self._next += 1
            try:
                work()
            except Exception:  # work completes its own future; never let the lane die
                logger.exception("tinker lane %s: a request raised", self.name)


class Coalescer:
    """Gathers items submitted under one key within a short window into one batch.

    A key's first item opens a batch; the batch goes to ``dispatch(key, items)`` (on a pool
    thread) once no item of its key came for ``quiet`` seconds, ``window`` seconds after it
    opened, or at ``max_items`` items, whichever is first. Items of other keys never mix."""

    def __init__(
        self,
        dispatch: Callable[[Any, list[Any]], None],
        submit: Callable[..., Any],
        *,
        quiet: float,
        window: float,
        max_items: int,
    ) -> None:
        self._dispatch = dispatch
        self._submit = submit
        self.quiet = quiet
        self.window = window
        self.max_items = max_items
        self._cond = threading.Condition()
        self._open: dict[Any, _Open] = {}

    def add(self, key: Any, item: Any) -> None:
        """Add ``item`` to ``key``'s open batch, opening one if there is none."""
        now = time.monotonic()
        with self._cond:
            batch = self._open.get(key)
            start = batch is None
            if batch is None:
                batch = self._open[key] = _Open(opened=now)
            batch.items.append(item)
            batch.last = now
            if len(batch.items) >= self.max_items:
                del self._open[key]
                batch.full = True
                self._cond.notify_all()
        if start:
            self._submit(self._hold, key, batch)

    def _hold(self, key: Any, batch: _Open) -> None:
        with self._cond:
            while not batch.full:
                due = min(batch.opened + self.window, batch.last + self.quiet)
                wait = due - time.monotonic()
                if wait <= 0:
                    if self._open.get(key) is batch:
                        del self._open[key]
                    break
                self._cond.wait(wait)
        self._dispatch(key, batch.items)


@dataclass
class _Open:
    opened: float
    last: float = 0.0
    full: bool = False
    items: list[Any] = field(default_factory=list)
