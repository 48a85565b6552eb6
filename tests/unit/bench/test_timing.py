"""bench.timing: warm-up count, alternating order, medians, paired ratios, counters, CPU.

Pure: the sides are fake calls that advance an injected clock by set amounts and log
their order; nothing sleeps and no figure depends on this machine's speed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import pytest

from bench.timing import Laps, Paired, Side, cpu_counter, paired, timed


class FakeClock:
    """A clock that only moves when a fake call says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sides(clock: FakeClock, cost: dict[str, list[float]], log: list[str]) -> dict[str, object]:
    """Calls that log their name and advance ``clock`` by their next cost (cycling)."""
    cycles = {name: itertools.cycle(c) for name, c in cost.items()}

    def make(name: str) -> Callable[[], str]:
        def call() -> str:
            log.append(name)
            clock.now += next(cycles[name])
            return name

        return call

    return {name: make(name) for name in cost}


def _run(cost: dict[str, list[float]], **kwargs: object) -> tuple[Paired, list[str]]:
    clock, cpu, log = FakeClock(), FakeClock(), []
    sides = _sides(clock, cost, log)
    result = paired(sides, clock=clock, cpu_clock=cpu, load=lambda: 0.5, **kwargs)  # type: ignore[arg-type]
    return result, log


def test_warmup_calls_each_side_in_turn_untimed() -> None:
    result, log = _run({"a": [1.0], "b": [2.0]}, repeats=2, warmup=3)
    assert log[:6] == ["a", "b"] * 3
    assert len(log) == 6 + 4
    assert result.warmup == 3
    assert len(result.samples("a")) == len(result.samples("b")) == 2


def test_order_alternates_between_rounds() -> None:
    result, log = _run({"a": [1.0], "b": [2.0]}, repeats=4)
    assert log == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [r.order for r in result.rounds] == [["a", "b"], ["b", "a"]] * 2


def test_three_sides_reverse_and_fixed_order() -> None:
    _, log = _run({"a": [1.0], "b": [1.0], "c": [1.0]}, repeats=2)
    assert log == ["a", "b", "c", "c", "b", "a"]
    _, log = _run({"a": [1.0], "b": [1.0]}, repeats=3, alternate=False)
    assert log == ["a", "b"] * 3


def test_calls_per_turn_run_back_to_back() -> None:
    result, log = _run({"a": [1.0], "b": [3.0]}, repeats=2, calls=3)
    assert log == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    assert len(result.samples("a")) == 6
    assert result.ratios("b", "a") == [3.0, 3.0]


def test_medians_and_ratios() -> None:
    # a: 1, 2, 9 (median 2); b: 2, 2, 3 (median 2); pairs b/a: 2, 1, 1/3
    result, _ = _run({"a": [1.0, 2.0, 9.0], "b": [2.0, 2.0, 3.0]}, repeats=3)
    assert result.values("a") == [1.0, 2.0, 9.0]
    assert result.median("a") == 2.0
    assert result.median("b") == 2.0
    assert result.ratios("b", "a") == pytest.approx([2.0, 1.0, 3.0 / 9.0])
    assert result.ratio("b", "a") == 1.0
    assert result.ratio_of_medians("b", "a") == 1.0
    assert all(r.load_1min == 0.5 for r in result.rounds)


def test_cpu_seconds_per_side() -> None:
    clock, cpu, log = FakeClock(), FakeClock(), []

    def a() -> None:
        log.append("a")
        clock.now += 1.0
        cpu.now += 0.25

    def b() -> None:
        log.append("b")
        clock.now += 1.0

    result = paired({"a": a, "b": b}, repeats=2, clock=clock, cpu_clock=cpu, load=lambda: 0.0)
    assert result.values("a", "cpu") == [0.25, 0.25]
    assert result.values("b", "cpu") == [0.0, 0.0]


def test_counters_change_over_the_call_only() -> None:
    clock, total = FakeClock(), {"worker": 0.0}
    reads: list[str] = []

    def through() -> dict[str, int]:
        reads.append("call")
        clock.now += 2.0
        total["worker"] += 1.5
        return {"tokens": 8}

    def worker() -> float:
        reads.append("read")
        return total["worker"]

    side = Side(through, counters={"worker": worker}, measure=lambda out: out)
    sample = timed(side, clock=clock, cpu_clock=FakeClock())
    assert reads == ["read", "call", "read"]
    assert sample.wall == 2.0
    assert sample.counters == {"worker": 1.5}
    assert sample.figures == {"tokens": 8}
    assert sample.value("worker") == 1.5
    assert sample.value("tokens") == 8


def test_per_divides_a_figure_by_wall_or_cpu() -> None:
    clock, cpu = FakeClock(), FakeClock()

    def call() -> dict[str, float]:
        clock.now += 2.0
        cpu.now += 4.0
        return {"tokens": 8.0}

    result = paired(
        {"a": Side(call, measure=lambda out: out)},
        repeats=2,
        clock=clock,
        cpu_clock=cpu,
        load=lambda: 0.0,
    )
    assert result.per("a", "tokens") == [4.0, 4.0]
    assert result.per("a", "tokens", "cpu") == [2.0, 2.0]


def test_before_runs_outside_the_window() -> None:
    clock, log = FakeClock(), []

    def barrier() -> None:
        log.append("barrier")
        clock.now += 100.0  # a slow barrier must not count

    result = paired(
        _sides(clock, {"a": [1.0]}, log),  # type: ignore[arg-type]
        repeats=2,
        warmup=1,
        before=barrier,
        clock=clock,
        cpu_clock=FakeClock(),
        load=lambda: 0.0,
    )
    assert log == ["barrier", "a"] * 3
    assert result.values("a") == [1.0, 1.0]


def test_slowest_takes_each_sample_from_the_slower_process() -> None:
    one, _ = _run({"flat": [1.0, 5.0], "ours": [2.0, 2.0]}, repeats=2, alternate=False)
    two, _ = _run({"flat": [3.0, 1.0], "ours": [1.0, 4.0]}, repeats=2, alternate=False)
    both = Paired.slowest([one, two])
    assert both.values("flat") == [3.0, 5.0]
    assert both.values("ours") == [2.0, 4.0]
    again = Paired.model_validate_json(both.model_dump_json())
    assert again.ratios("flat", "ours") == [1.5, 1.25]


def test_summary_names_every_side() -> None:
    result, _ = _run({"direct": [1.0], "through": [1.1]}, repeats=2)
    text = result.summary()
    assert "direct: median 1000.0 ms" in text
    assert "through / direct: 1.100 paired" in text


def test_laps_split_a_call() -> None:
    clock = FakeClock()
    laps = Laps(clock)
    clock.now += 1.0
    laps.mark("sample")
    clock.now += 0.5
    laps.mark("train")
    assert laps.seconds == {"sample": 1.0, "train": 0.5}


def test_cpu_counter_of_no_process_is_zero() -> None:
    class Proc:
        def cpu_times(self) -> object:
            return type("T", (), {"user": 1.0, "system": 0.5})()

    assert cpu_counter(None)() == 0.0
    assert cpu_counter(Proc())() == 1.5
    own = cpu_counter(os.getpid())
    assert own() > 0.0  # this process has run


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        paired({}, repeats=1)
    with pytest.raises(ValueError):
        paired({"a": lambda: None}, repeats=0)
