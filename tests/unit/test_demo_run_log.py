"""The demo's run log: one step axis that never goes back, --report-to checked before a run."""

from __future__ import annotations

import json

import pytest

from arctic_platform.rl.errors import UnknownPluginError
from arctic_rl_demo.run_log import RunLog, tracker_step
from arctic_rl_demo.tasks.lookup.settings import LookupSettings
from arctic_rl_demo.tasks.reverse.settings import DemoSettings


def _records(warm: int, steps: int, eval_every: int) -> list[dict]:
    """The order both demos write: eval before, warm start, eval after, RL with evals, final."""
    out: list[dict] = [{"phase": "eval", "rl_step": -1}]
    out += [{"phase": "sft", "step": i} for i in range(warm)]
    out.append({"phase": "eval", "rl_step": 0})
    for k in range(steps):
        out.append({"phase": "rl", "step": k})
        if (k + 1) % eval_every == 0 and k + 1 < steps:
            out.append({"phase": "eval", "rl_step": k + 1})
    out.append({"phase": "eval", "rl_step": steps})
    return out


def test_tracker_steps_never_go_back_and_each_rl_step_has_its_own():
    records = _records(warm=4, steps=7, eval_every=3)
    steps = [tracker_step(r, 4) for r in records]
    assert steps == sorted(steps)
    rl = [tracker_step(r, 4) for r in records if r["phase"] == "rl"]
    assert rl == list(range(4, 11))
    assert tracker_step({"phase": "eval", "rl_step": 7}, 4) == 11


def test_report_to_is_checked_when_the_settings_are_made(tmp_path):
    assert DemoSettings(report_to="TensorBoard, wandb", output_dir=tmp_path).report_to == (
        "tensorboard",
        "wandb",
    )
    assert LookupSettings(report_to="none", output_dir=tmp_path).report_to == ()
    for settings in (DemoSettings, LookupSettings):
        with pytest.raises(UnknownPluginError, match=r"tracker .tensorbord.*Installed: .*mlflow"):
            settings(report_to="tensorbord", output_dir=tmp_path)


def test_the_run_log_writes_jsonl_and_keeps_the_history_without_trackers(tmp_path):
    log = RunLog(tmp_path, DemoSettings(output_dir=tmp_path), (), warm_steps=2)
    for record in _records(warm=2, steps=2, eval_every=5):
        log.write(record)
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == log.records and len(lines) == 7
