"""A stand-in for ``ray.util.metrics`` (``Counter``, ``Gauge``, ``Histogram``) whose records
go into the process's ``Recorder`` buffers and reach Ray from its flusher thread.

vLLM's Ray stat logger records a few dozen values every engine step; through this module
(``vllm.v1.metrics.ray_wrappers.ray_metrics`` is bound to it) each costs a dict update
instead of a call into Ray on the engine's own loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arctic_platform.rl.observe import recorder
from arctic_platform.rl.observe.recorder import MetricSpec


class _Metric:
    kind = ""

    def __init__(
        self,
        name: str,
        description: str = "",
        tag_keys: Sequence[str] | None = None,
        boundaries: Sequence[float] | None = None,
    ) -> None:
        self._tag_keys = tuple(tag_keys or ())
        self._default_tags: dict[str, str] = {}
        self._spec = MetricSpec(
            name, self.kind, description or "", self._tag_keys, tuple(boundaries or ())
        )

    def set_default_tags(self, default_tags: dict[str, str]) -> _Metric:
        """Tags every record of this metric carries unless it gives its own."""
        self._default_tags = {k: str(v) for k, v in default_tags.items()}
        return self

    def _record(self, method: str, value: float, tags: dict[str, Any] | None) -> None:
        merged = {**self._default_tags, **{k: str(v) for k, v in (tags or {}).items()}}
        if set(merged) != set(self._tag_keys):
            raise ValueError(
                f"metric {self._spec.name} takes tags {list(self._tag_keys)}, got {sorted(merged)}"
            )
        if recorder.RECORDER.active():
            labels = tuple(sorted(merged.items()))
            recorder.RECORDER.buffer(self._spec, method, float(value), labels)


class Counter(_Metric):
    """A counter; ``inc`` adds a positive value."""

    kind = "counter"

    def inc(self, value: float = 1.0, tags: dict[str, Any] | None = None) -> None:
        """Add ``value`` (> 0) for ``tags``."""
        if value > 0:
            self._record("inc", value, tags)


class Gauge(_Metric):
    """A gauge; ``set`` gives its current value."""

    kind = "gauge"

    def set(self, value: float, tags: dict[str, Any] | None = None) -> None:
        """The current value for ``tags``."""
        self._record("set", value, tags)


class Histogram(_Metric):
    """A histogram with fixed bucket boundaries; ``observe`` adds one value."""

    kind = "histogram"

    def observe(self, value: float, tags: dict[str, Any] | None = None) -> None:
        """One observation for ``tags``."""
        self._record("observe", value, tags)


__all__ = ["Counter", "Gauge", "Histogram"]
