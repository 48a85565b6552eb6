"""Paired timing for the benchmarks: warm-up, alternating order, medians and paired ratios.

Every benchmark compares two (or more) ways of doing the same work in one run. Timing the
sides in pairs, back to back and in alternating order (AB, BA, ...), puts both under the same
load of this shared machine, so the median of the pairs' ratios moves little when the load
drifts. CPU seconds of this process (and of other processes, through counters) are kept too:
unlike wall time they hardly depend on the load.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

Clock = Callable[[], float]
Counter = Callable[[], float]
"""A running total read before and after a timed call (outside the window); the change is kept."""


@dataclass
class Side:
    """One side of a paired timing: the call, its counters, and what to keep of its result.

    ``counters``: running totals (e.g. a server's CPU seconds, its time spent in workers),
    read just outside the timed window; a sample keeps each one's change over the call.
    ``measure``: figures taken from the call's return value (e.g. tokens generated, the
    parts of a step), after the window.
    """

    fn: Callable[[], Any]
    counters: Mapping[str, Counter] = field(default_factory=dict)
    measure: Callable[[Any], Mapping[str, float]] | None = None


class Sample(BaseModel):
    """One timed call: wall and CPU seconds, counters' changes and measured figures."""

    wall: float
    cpu: float
    counters: dict[str, float] = Field(default_factory=dict)
    figures: dict[str, float] = Field(default_factory=dict)

    def value(self, key: str) -> float:
        """``wall``, ``cpu``, or a counter's or figure's name."""
        if key in ("wall", "cpu"):
            return float(getattr(self, key))
        if key in self.counters:
            return self.counters[key]
        return self.figures[key]


class Round(BaseModel):
    """One turn of every side, in ``order``; ``calls`` samples per side."""

    order: list[str]
    samples: dict[str, list[Sample]]
    load_1min: float = 0.0

    def median(self, side: str, key: str = "wall") -> float:
        """The median of ``key`` over this round's calls of ``side``."""
        return statistics.median(s.value(key) for s in self.samples[side])


class Paired(BaseModel):
    """What a paired timing measured: every round, in the order they ran."""

    sides: list[str]
    warmup: int
    rounds: list[Round]

    def samples(self, side: str) -> list[Sample]:
        """Every sample of ``side``, in the order they ran (round by round)."""
        return [s for r in self.rounds for s in r.samples[side]]

    def values(self, side: str, key: str = "wall") -> list[float]:
        """``key`` of every sample of ``side``."""
        return [s.value(key) for s in self.samples(side)]

    def per(self, side: str, figure: str, key: str = "wall") -> list[float]:
        """``figure / key`` of every sample of ``side`` (e.g. tokens per wall second)."""
        return [s.value(figure) / s.value(key) for s in self.samples(side)]

    def median(self, side: str, key: str = "wall") -> float:
        """The median of ``key`` over every sample of ``side``."""
        return statistics.median(self.values(side, key))

    def ratios(self, a: str, b: str, key: str = "wall") -> list[float]:
        """Each round's ``a / b`` (of the round's medians when a side has several calls)."""
        return [r.median(a, key) / r.median(b, key) for r in self.rounds]

    def ratio(self, a: str, b: str, key: str = "wall") -> float:
        """The median of the rounds' ``a / b``: the paired figure."""
        return statistics.median(self.ratios(a, b, key))

    def ratio_of_medians(self, a: str, b: str, key: str = "wall") -> float:
        """``a``'s median over ``b``'s median (all samples)."""
        return self.median(a, key) / self.median(b, key)

    def summary(self) -> str:
        """A few lines for a terminal: each side's medians, and each side's ratio to the first."""
        lines = []
        for side in self.sides:
            cpu = self.median(side, "cpu")
            lines.append(
                f"{side}: median {self.median(side) * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU"
                f" ({len(self.samples(side))} samples)"
            )
        first = self.sides[0]
        for side in self.sides[1:]:
            lines.append(
                f"{side} / {first}: {self.ratio(side, first):.3f} paired"
                f" ({self.ratio_of_medians(side, first):.3f} of medians)"
            )
        return "\n".join(lines)

    @classmethod
    def slowest(cls, parts: Sequence[Paired]) -> Paired:
        """Sample by sample, the slowest of the same timing run in several processes.

        Both ends of a transfer time it; the transfer takes as long as its slower end.
        """
        first = parts[0]
        rounds = []
        for i, r in enumerate(first.rounds):
            samples = {}
            for side, own in r.samples.items():
                samples[side] = [
                    max((p.rounds[i].samples[side][k] for p in parts), key=lambda s: s.wall)
                    for k in range(len(own))
                ]
            rounds.append(Round(order=r.order, samples=samples, load_1min=r.load_1min))
        return cls(sides=first.sides, warmup=first.warmup, rounds=rounds)


def cpu_counter(process: Any) -> Counter:
    """A counter of the CPU seconds (user + system) a process has used; 0 if None.

    ``process``: a ``psutil.Process`` (or anything with ``cpu_times()``), or a pid.
    """
    if isinstance(process, int):
        import psutil

        process = psutil.Process(process)

    def read() -> float:
        if process is None:
            return 0.0
        times = process.cpu_times()
        return float(times.user + times.system)

    return read


def load_1min() -> float:
    """The machine's one-minute load average."""
    return os.getloadavg()[0]


def timed(
    side: Side | Callable[[], Any],
    *,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock = time.process_time,
    before: Callable[[], Any] | None = None,
) -> Sample:
    """One call of ``side`` timed: ``before`` (e.g. a barrier) and counters outside the window."""
    side = side if isinstance(side, Side) else Side(side)
    if before is not None:
        before()
    start = {name: read() for name, read in side.counters.items()}
    cpu0 = cpu_clock()
    t0 = clock()
    out = side.fn()
    wall = clock() - t0
    cpu = cpu_clock() - cpu0
    changes = {name: read() - start[name] for name, read in side.counters.items()}
    figures = dict(side.measure(out)) if side.measure is not None else {}
    return Sample(wall=wall, cpu=cpu, counters=changes, figures=figures)


def paired(
    sides: Mapping[str, Side | Callable[[], Any]],
    repeats: int,
    warmup: int = 0,
    *,
    calls: int = 1,
    alternate: bool = True,
    before: Callable[[], Any] | None = None,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock = time.process_time,
    load: Clock = load_1min,
) -> Paired:
    """``warmup`` untimed calls a side, then ``repeats`` rounds of ``calls`` timed calls a side.

    Rounds run the sides in the given order, then reversed, and so on (AB, BA, ...) unless
    ``alternate`` is off. Fresh engines and workers run their first calls slower than later
    ones, hence the warm-up (one call of each side in turn, untimed). ``before`` runs before
    every call, warm-up included, outside the window (e.g. a barrier between processes).
    """
    if not sides:
        raise ValueError("paired() needs at least one side")
    if repeats < 1 or calls < 1 or warmup < 0:
        raise ValueError("repeats and calls must be >= 1, warmup >= 0")
    named = {name: s if isinstance(s, Side) else Side(s) for name, s in sides.items()}
    names = list(named)
    for _ in range(warmup):
        for name in names:
            if before is not None:
                before()
            named[name].fn()
    rounds = []
    for i in range(repeats):
        order = names if i % 2 == 0 or not alternate else names[::-1]
        samples: dict[str, list[Sample]] = {name: [] for name in names}
        for name in order:
            for _ in range(calls):
                sample = timed(named[name], clock=clock, cpu_clock=cpu_clock, before=before)
                samples[name].append(sample)
        rounds.append(Round(order=list(order), samples=samples, load_1min=load()))
    return Paired(sides=names, warmup=warmup, rounds=rounds)


class Laps:
    """Split one timed call into named parts: ``mark(name)`` ends the part since the last mark."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """End the part ``name`` now."""
        now = self._clock()
        self.seconds[name] = now - self._last
        self._last = now
