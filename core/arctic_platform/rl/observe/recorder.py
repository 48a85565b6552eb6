"""Record the metrics of ``families`` in this process through Ray's metrics API.

Each process (the server, every engine worker) records what it observes; Ray's metrics agent
on its node serves the values to Prometheus. A record only updates this process's buffers
(a dict operation under a lock, about a microsecond); a daemon thread hands them to Ray every
``refresh_seconds`` (counters as one increment, each histogram observation, every gauge set
again, since Ray drops a gauge left alone for two export periods). Recording is a no-op until
Ray is initialised in the process, and always with ``ARCTIC_RL_METRICS=0``; a failure to hand
a value to Ray is logged once and never reaches a caller. vLLM's Ray stat logger records
through the same buffers (``deferred_metrics``), so its engine loop never waits on Ray either.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from arctic_platform.rl.observe.families import BY_NAME, SECONDS_BUCKETS

logger = logging.getLogger(__name__)

SWITCH = "ARCTIC_RL_METRICS"
"""Environment switch: ``0`` (or off/false/no) turns every metric off in this process and in
the workers the server starts."""

REPORT_INTERVAL = "RAY_metrics_report_interval_ms"
"""Ray's export period (10 000 ms by default, never below 1 000)."""

MAX_PENDING = 100_000
"""Histogram observations kept per series between two flushes; beyond it the newest are
dropped (and counted in the log), so a stalled flusher cannot grow the process."""


def metrics_enabled() -> bool:
    """Whether metrics are on in this process (``ARCTIC_RL_METRICS``, default on)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def refresh_seconds() -> float:
    """How often buffers go to Ray: half of Ray's export period, at most 5 s."""
    try:
        period = max(1000.0, float(os.environ.get(REPORT_INTERVAL, "10000"))) / 1000.0
    except ValueError:
        period = 10.0
    return max(0.5, min(5.0, period / 2))


@dataclass(frozen=True)
class MetricSpec:
    """What Ray needs to make a metric: its name, kind, description, tag keys, buckets."""

    name: str
    kind: str
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


Labels = tuple[tuple[str, str], ...]


@functools.cache
def _spec_of(name: str) -> MetricSpec:
    family = BY_NAME[name]
    buckets = SECONDS_BUCKETS if family.kind == "histogram" else ()
    return MetricSpec(family.name, family.kind, family.help, family.labels, buckets)


class Recorder:
    """This process's metric buffers, the Ray metrics made from them, and the flusher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, Any] = {}
        self._specs: dict[str, MetricSpec] = {}
        self._counts: dict[tuple[str, Labels], float] = defaultdict(float)
        self._observed: dict[tuple[str, Labels], list[float]] = defaultdict(list)
        self._gauges: dict[tuple[str, Labels], float] = {}
        self._flusher: threading.Thread | None = None
        self._warned = False
        self._dropped = 0

    @staticmethod
    def active() -> bool:
        """Whether recording does anything now: metrics on and Ray initialised here."""
        if not metrics_enabled():
            return False
        ray = sys.modules.get("ray")
        return ray is not None and bool(ray.is_initialized())

    # --- recording (any thread) --------------------------------------------------------

    def _labels(self, name: str, tags: dict[str, Any]) -> Labels:
        family = BY_NAME[name]
        if set(tags) != set(family.labels):
            raise ValueError(
                f"metric {family.name} takes labels {list(family.labels)}, got {sorted(tags)}"
            )
        return tuple(sorted((k, str(v)) for k, v in tags.items()))

    def inc(self, name: str, value: float = 1.0, **tags: Any) -> None:
        """Add ``value`` (> 0; smaller values are ignored) to counter ``name``."""
        labels = self._labels(name, tags)  # a wrong label is our bug: raised, even when off
        if value > 0 and self.active():
            self.buffer(_spec_of(name), "inc", float(value), labels)

    def observe(self, name: str, value: float, **tags: Any) -> None:
        """Add one observation to histogram ``name``."""
        labels = self._labels(name, tags)
        if self.active():
            self.buffer(_spec_of(name), "observe", float(value), labels)

    def set(self, name: str, value: float, **tags: Any) -> None:
        """Set gauge ``name``; it is handed to Ray again at every flush until set again."""
        labels = self._labels(name, tags)
        if self.active():
            self.buffer(_spec_of(name), "set", float(value), labels)

    def buffer(self, spec: MetricSpec, method: str, value: float, labels: Labels) -> None:
        """Keep one record of any metric (ours or vLLM's) for the next flush."""
        key = (spec.name, labels)
        with self._lock:
            self._specs.setdefault(spec.name, spec)
            if method == "inc":
                self._counts[key] += value
            elif method == "set":
                self._gauges[key] = value
            else:
                pending = self._observed[key]
                if len(pending) < MAX_PENDING:
                    pending.append(value)
                else:
                    self._dropped += 1
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._keep, daemon=True, name="arctic-rl-metrics"
                )
                self._flusher.start()
                atexit.register(self.flush)

    def forget(self, name: str, **tags: Any) -> None:
        """Stop handing gauge ``name`` with these labels to Ray (it then ages out there)."""
        key = (name, tuple(sorted((k, str(v)) for k, v in tags.items())))
        with self._lock:
            self._gauges.pop(key, None)

    def gauges(self, name: str) -> dict[Labels, float]:
        """The label sets and values of gauge ``name`` being handed to Ray."""
        with self._lock:
            return {labels: v for (n, labels), v in self._gauges.items() if n == name}

    @contextlib.contextmanager
    def timed(self, name: str, **tags: Any) -> Iterator[None]:
        """Observe the block's seconds in histogram ``name`` (also when it raises)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.observe(name, time.monotonic() - started, **tags)

    # --- flushing (the daemon thread) ---------------------------------------------------

    def _metric(self, spec: MetricSpec) -> Any:
        made = self._made.get(spec.name)
        if made is None:
            from ray.util import metrics

            if spec.kind == "counter":
                made = metrics.Counter(spec.name, spec.description, spec.tag_keys)
            elif spec.kind == "gauge":
                made = metrics.Gauge(spec.name, spec.description, spec.tag_keys)
            else:
                made = metrics.Histogram(
                    spec.name, spec.description, list(spec.boundaries), spec.tag_keys
                )
            self._made[spec.name] = made
        return made

    def flush(self) -> None:
        """Hand every buffered record to Ray now (the flusher does it every few seconds)."""
        if not self.active():
            return
        with self._lock:
            counts, self._counts = self._counts, defaultdict(float)
            observed, self._observed = self._observed, defaultdict(list)
            gauges = list(self._gauges.items())
            specs = dict(self._specs)
            dropped, self._dropped = self._dropped, 0
        work: list[tuple[str, Labels, str, list[float]]] = [
            *((n, labels, "inc", [v]) for (n, labels), v in counts.items()),
            *((n, labels, "observe", values) for (n, labels), values in observed.items()),
            *((n, labels, "set", [v]) for (n, labels), v in gauges),
        ]
        for name, labels, method, values in work:
            try:  # one metric Ray refuses does not hold back the others
                record, tags = getattr(self._metric(specs[name]), method), dict(labels)
                for value in values:
                    record(value, tags=tags)
            except Exception as exc:  # metrics never break the process they observe
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "metric %s not handed to Ray (%s); further failures not logged", name, exc
                    )
        if dropped:
            logger.warning("metrics: %d histogram observations dropped (flusher behind)", dropped)

    def _keep(self) -> None:
        while True:
            time.sleep(refresh_seconds())
            self.flush()


RECORDER = Recorder()
"""This process's recorder."""

inc = RECORDER.inc
observe = RECORDER.observe
set_gauge = RECORDER.set
timed = RECORDER.timed

__all__ = [
    "RECORDER",
    "SWITCH",
    "MetricSpec",
    "Recorder",
    "inc",
    "metrics_enabled",
    "observe",
    "refresh_seconds",
    "set_gauge",
    "timed",
]
