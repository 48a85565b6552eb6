"""A demo run's log: each record to ``metrics.jsonl``, to the in-memory history and to the
experiment trackers of ``--report-to`` (``RunTracker``), one step axis for all phases."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import RunTracker, get_registry, parse_report_to


def tracker_step(record: dict[str, Any], warm_steps: int) -> int:
    """The record's place on the trackers' one step axis: warm-start step ``i`` is ``i``, GRPO
    step ``k`` is ``warm_steps + k``, an evaluation sits where its GRPO step begins (the one
    before the warm start at 0), so the steps never go back."""
    phase = record["phase"]
    if phase == "sft":
        return int(record["step"])
    if phase == "rl":
        return warm_steps + int(record["step"])
    rl_step = int(record["rl_step"])
    return 0 if rl_step < 0 else warm_steps + rl_step


class RunLog:
    """Where a run's records go; ``close()`` ends the trackers' runs."""

    def __init__(
        self, out: Path, settings: Any, report_to: tuple[str, ...], warm_steps: int
    ) -> None:
        config = dataclasses.asdict(settings)
        self.tracker = RunTracker(
            report_to, out, project="arctic-rl-demo", run_name=out.name, config=config
        )
        self.file = (out / "metrics.jsonl").open("w")
        self.records: list[dict[str, Any]] = []
        self.warm_steps = warm_steps

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append ``record`` to ``metrics.jsonl`` and the history; its numbers go to every
        tracker under ``PHASE/NAME``."""
        self.records.append(record)
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        numbers = {k: v for k, v in record.items() if k not in ("phase", "step", "rl_step")}
        self.tracker.log({record["phase"]: numbers}, step=tracker_step(record, self.warm_steps))
        return record

    def close(self) -> None:
        """Close the file and end the trackers' runs."""
        self.file.close()
        self.tracker.close()


def check_report_to(report_to: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``--report-to``'s tracker names, each an installed tracker (else ``UnknownPluginError``,
    a ``ValueError``, listing the installed ones) - checked before any server starts."""
    names = parse_report_to(report_to)
    registry = get_registry()
    for name in names:
        registry.get("tracker", name, field="report_to")
    return tuple(names)
