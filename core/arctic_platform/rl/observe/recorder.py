"""Record the metrics of ``families`` in this process through Ray's metrics API.

Each process (the server, every engine worker) records what it observes; Ray's metrics agent
on its node serves the values to Prometheus. Recording is a no-op until Ray is initialised in
the process, and always with ``ARCTIC_RL_METRICS=0``; a failure to record is logged once and
never reaches the caller. Gauges are set again every few seconds by a daemon thread, because
Ray drops a gauge that is not set within two export periods.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from arctic_platform.rl.observe.families import BY_NAME, SECONDS_BUCKETS, Family

logger = logging.getLogger(__name__)

SWITCH = "ARCTIC_RL_METRICS"
"""Environment switch: ``0`` (or off/false/no) turns every metric off in this process and in
the workers the server starts."""

REPORT_INTERVAL = "RAY_metrics_report_interval_ms"
"""Ray's export period (10 000 ms by default, never below 1 000)."""


def metrics_enabled() -> bool:
    """Whether metrics are on in this process (``ARCTIC_RL_METRICS``, default on)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def refresh_seconds() -> float:
    """How often gauges are set again: half of Ray's export period, at most 5 s."""
    try:
        period = max(1000.0, float(os.environ.get(REPORT_INTERVAL, "10000"))) / 1000.0
    except ValueError:
        period = 10.0
    return max(0.5, min(5.0, period / 2))


class Recorder:
    """This process's metric objects, made on first use, and the gauges to keep alive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, Any] = {}
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._keeper: threading.Thread | None = None
        self._warned = False

    @staticmethod
    def active() -> bool:
        """Whether recording does anything now: metrics on and Ray initialised here."""
        if not metrics_enabled():
            return False
        ray = sys.modules.get("ray")
        return ray is not None and bool(ray.is_initialized())

    def _metric(self, family: Family) -> Any:
        made = self._made.get(family.name)
        if made is not None:
            return made
        from ray.util import metrics

        with self._lock:
            made = self._made.get(family.name)
            if made is None:
                if family.kind == "counter":
                    made = metrics.Counter(family.name, family.help, family.labels)
                elif family.kind == "gauge":
                    made = metrics.Gauge(family.name, family.help, family.labels)
                else:
                    made = metrics.Histogram(
                        family.name, family.help, list(SECONDS_BUCKETS), family.labels
                    )
                self._made[family.name] = made
        return made

    @staticmethod
    def _tags(family: Family, tags: dict[str, Any]) -> dict[str, str]:
        if set(tags) != set(family.labels):
            raise ValueError(
                f"metric {family.name} takes labels {list(family.labels)}, got {sorted(tags)}"
            )
        return {k: str(v) for k, v in tags.items()}

    def _record(self, name: str, method: str, value: float, tags: dict[str, Any]) -> None:
        family = BY_NAME[name]
        labels = self._tags(family, tags)  # a wrong label is our bug: raised, even when off
        if not self.active():
            return
        try:
            getattr(self._metric(family), method)(value, tags=labels)
        except Exception as exc:  # metrics never break the call they observe
            if not self._warned:
                self._warned = True
                logger.warning(
                    "metric %s not recorded (%s); further failures not logged", name, exc
                )

    def inc(self, name: str, value: float = 1.0, **tags: Any) -> None:
        """Add ``value`` (> 0; smaller values are ignored) to counter ``name``."""
        if value > 0:
            self._record(name, "inc", float(value), tags)

    def observe(self, name: str, value: float, **tags: Any) -> None:
        """Add one observation to histogram ``name``."""
        self._record(name, "observe", float(value), tags)

    def set(self, name: str, value: float, **tags: Any) -> None:
        """Set gauge ``name``; it is set again periodically until set to another value."""
        self._record(name, "set", float(value), tags)
        if not self.active():
            return
        key = (name, tuple(sorted((k, str(v)) for k, v in tags.items())))
        with self._lock:
            self._gauges[key] = float(value)
            if self._keeper is None:
                self._keeper = threading.Thread(
                    target=self._keep, daemon=True, name="arctic-rl-metric-gauges"
                )
                self._keeper.start()

    def forget(self, name: str, **tags: Any) -> None:
        """Stop setting gauge ``name`` with these labels again (it then ages out of Ray)."""
        key = (name, tuple(sorted((k, str(v)) for k, v in tags.items())))
        with self._lock:
            self._gauges.pop(key, None)

    def gauges(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The label sets and values of gauge ``name`` being kept alive."""
        with self._lock:
            return {labels: v for (n, labels), v in self._gauges.items() if n == name}

    def _keep(self) -> None:
        while True:
            time.sleep(refresh_seconds())
            if not self.active():
                continue
            with self._lock:
                kept = list(self._gauges.items())
            for (name, labels), value in kept:
                with contextlib.suppress(Exception):
                    self._metric(BY_NAME[name]).set(value, tags=dict(labels))

    @contextlib.contextmanager
    def timed(self, name: str, **tags: Any) -> Iterator[None]:
        """Observe the block's seconds in histogram ``name`` (also when it raises)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.observe(name, time.monotonic() - started, **tags)


RECORDER = Recorder()
"""This process's recorder."""

inc = RECORDER.inc
observe = RECORDER.observe
set_gauge = RECORDER.set
timed = RECORDER.timed

__all__ = [
    "RECORDER",
    "SWITCH",
    "Recorder",
    "inc",
    "metrics_enabled",
    "observe",
    "refresh_seconds",
    "set_gauge",
    "timed",
]
