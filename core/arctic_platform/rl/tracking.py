"""Experiment trackers for the loop side: ``RunTracker`` writes a loop's metrics to the trackers
a user picks (``report_to``, as TRL names it), each a plugin of kind ``tracker``.

The loop hands ``RunTracker.log`` what our calls returned (``fwd_bwd``, ``step``,
``sync_weights``, ``generate``'s figures) beside its own numbers (reward, lengths), nested as it
likes; they are flattened to ``a/b`` keys of floats, everything that is not a number (texts,
token lists, ``None``) left out. Trackers come from entry points (``arctic-rl plugins list``
shows them), so a third party adds one without touching core::

    from arctic_platform.rl import RunTracker

    with RunTracker(["tensorboard", "wandb"], log_dir="runs/x", config=settings) as tracker:
        for step in range(steps):
            out = client.fwd_bwd(batch, "grpo"); stepped = client.step()
            tracker.log({"train": out, "optim": stepped, "reward_mean": reward}, step=step)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from arctic_platform.rl.errors import InvalidRequestError

log = logging.getLogger(__name__)

NO_TRACKERS = ("none", "")
"""``report_to`` values that name no tracker (``--report-to none``, TRL's spelling)."""


class TrackerSettings(BaseModel):
    """What every tracker is built with: where to write, the project and run names, and the
    run's configuration (its hyper-parameters, logged once)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    log_dir: Path = Field(description="the run's output directory; a tracker writes under it")
    project: str = "arctic-rl"
    run_name: str = "run"
    config: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Tracker(Protocol):
    """One experiment tracker, as a ``TrackerSpec``'s factory builds it."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (flat names, floats) at ``step``."""

    def close(self) -> None:
        """Flush and end the run."""


def parse_report_to(report_to: str | Iterable[str] | None) -> list[str]:
    """Tracker names from ``"a,b"``, a list, ``None`` or ``"none"``: lower-cased, in order,
    each once."""
    if report_to is None:
        return []
    items = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidRequestError(f"report_to: {item!r} is not a tracker name")
        name = item.strip().lower()
        if name not in NO_TRACKERS and name not in names:
            names.append(name)
    return names


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """``{"train": {"loss": 1.0}, "n": 3}`` -> ``{"train/loss": 1.0, "n": 3.0}``: numbers and
    booleans kept as floats (NaN and infinities too), everything else left out."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, name))
        elif isinstance(value, bool):
            flat[name] = float(value)
        elif isinstance(value, int | float):
            flat[name] = float(value)
        elif type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
            flat[name] = float(value)
    return flat


_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


def safe_metric_name(name: str) -> str:
    """A name every tracker accepts (MLflow's rule, the strictest): letters, digits and
    ``_ - . / space``; anything else (``:`` of Tinker's names) becomes ``_``."""
    return _UNSAFE.sub("_", name)


class RunTracker:
    """Writes one run's metrics to the trackers named in ``report_to``.

    Unknown names fail at construction with the installed ones listed; a tracker whose library
    is missing fails there too (``MissingDependencyError``). Steps must not go back (wandb drops
    such rows); a tracker that fails while logging is reported once and left out afterwards,
    so the run keeps training and the other trackers keep writing.
    """

    def __init__(
        self,
        report_to: str | Iterable[str] | None,
        log_dir: str | Path,
        project: str = "arctic-rl",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        from arctic_platform.rl.plugins import get_registry

        names = parse_report_to(report_to)
        registry = get_registry()
        specs = [registry.get("tracker", name, field="report_to") for name in names]
        path = Path(log_dir)
        settings = TrackerSettings(
            log_dir=path,
            project=project,
            run_name=run_name or path.resolve().name,
            config=_plain(dict(config or {})),
        )
        self.names = names
        self.trackers: dict[str, Tracker] = {}
        self.failed: dict[str, str] = {}
        self.last_step: int | None = None
        try:
            for spec in specs:
                self.trackers[spec.name] = spec.create(settings)
        except BaseException:
            self.close()
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> dict[str, float]:
        """Flatten ``metrics`` and write them at ``step`` to every tracker; returns what was
        written."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidRequestError(f"step must be a non-negative integer, got {step!r}")
        if self.last_step is not None and step < self.last_step:
            raise InvalidRequestError(
                f"step {step} comes after step {self.last_step}: steps must not go back"
            )
        self.last_step = step
        flat = {safe_metric_name(k): v for k, v in flatten_metrics(metrics).items()}
        if not flat:
            return flat
        for name, tracker in list(self.trackers.items()):
            try:
                tracker.log(flat, step)
            except Exception as exc:
                self._drop(name, exc)
        return flat

    def _drop(self, name: str, exc: Exception) -> None:
        self.failed[name] = f"{type(exc).__name__}: {exc}"
        self.trackers.pop(name, None)
        log.error("tracker %r failed and gets no more metrics: %s", name, self.failed[name])

    def close(self) -> None:
        """End every tracker's run (each once, also after a failure of another)."""
        trackers, self.trackers = self.trackers, {}
        for name, tracker in trackers.items():
            try:
                tracker.close()
            except Exception as exc:
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                log.error("tracker %r failed to close: %s", name, self.failed[name])

    def __enter__(self) -> RunTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """A configuration as JSON-like values (paths and other objects as strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)
