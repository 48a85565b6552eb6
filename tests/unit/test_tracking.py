"""RunTracker: names from report_to, flattening of what the loop hands over, the step rule, a
failing tracker left out, trackers found through the plugin registry like every other kind."""

from __future__ import annotations

import logging
import math

import pytest

from arctic_platform.rl.errors import InvalidRequestError, UnknownPluginError
from arctic_platform.rl.plugins import (
    Registry,
    TrackerSpec,
    get_registry,
    hookimpl,
    new_plugin_manager,
    set_registry,
)
from arctic_platform.rl.tracking import (
    RunTracker,
    TrackerSettings,
    flatten_metrics,
    parse_report_to,
    safe_metric_name,
)

WRITTEN: list[tuple[str, str, dict[str, float], int]] = []
BUILT: list[tuple[str, TrackerSettings]] = []


class ListTracker:
    """Records what it gets (a stand-in for a tracker library, which is outside this test)."""

    def __init__(self, settings: TrackerSettings, name: str = "list") -> None:
        self.name = name
        BUILT.append((name, settings))

    def log(self, metrics: dict[str, float], step: int) -> None:
        WRITTEN.append((self.name, "log", dict(metrics), step))

    def close(self) -> None:
        WRITTEN.append((self.name, "close", {}, -1))


class BrokenTracker(ListTracker):
    def log(self, metrics: dict[str, float], step: int) -> None:
        raise OSError("disk full")


def _bad_factory(settings: TrackerSettings) -> None:
    raise RuntimeError("cannot start")


class Trackers:
    @hookimpl
    def arctic_rl_register_trackers(self):
        yield TrackerSpec(name="list", factory=ListTracker)
        yield TrackerSpec(name="other", factory=lambda s: ListTracker(s, "other"))
        yield TrackerSpec(name="broken", factory=lambda s: BrokenTracker(s, "broken"))
        yield TrackerSpec(name="bad", factory=_bad_factory)


@pytest.fixture(autouse=True)
def registry():
    WRITTEN.clear()
    BUILT.clear()
    pm = new_plugin_manager(load_entrypoints=False)
    pm.register(Trackers(), name="trackers")
    set_registry(Registry(pm))
    yield
    set_registry(None)


def test_report_to_names_in_order_once_and_none_means_no_tracker():
    assert parse_report_to("TensorBoard, wandb,tensorboard") == ["tensorboard", "wandb"]
    assert parse_report_to(["mlflow", " none "]) == ["mlflow"]
    assert parse_report_to("none") == parse_report_to(None) == parse_report_to("") == []
    with pytest.raises(InvalidRequestError):
        parse_report_to([3])  # type: ignore[list-item]


def test_flatten_keeps_numbers_under_slash_joined_names_and_drops_the_rest():
    import numpy as np

    flat = flatten_metrics(
        {
            "train": {"loss": 1, "ratio": {"min": 0.5}, "note": "x", "ids": [1, 2]},
            "ok": True,
            "missing": None,
            "k3": np.float32(0.25),
            "nan": float("nan"),
        }
    )
    assert flat.keys() == {"train/loss", "train/ratio/min", "ok", "k3", "nan"}
    assert flat["train/loss"] == 1.0 and isinstance(flat["train/loss"], float)
    assert flat["ok"] == 1.0 and flat["k3"] == 0.25 and math.isnan(flat["nan"])


def test_metric_names_keep_what_every_tracker_accepts():
    assert safe_metric_name("kl_sample_train_v1:mean") == "kl_sample_train_v1_mean"
    assert safe_metric_name("rl/seconds/fwd_bwd.max x") == "rl/seconds/fwd_bwd.max x"


def test_every_tracker_gets_the_flat_metrics_at_the_step_and_is_closed(tmp_path):
    with RunTracker(
        "list,other", tmp_path, project="p", config={"lr": 1e-3, "out": tmp_path}
    ) as tracker:
        written = tracker.log({"train": {"loss": 0.5, "tinker:x": 2}, "text": "t"}, step=3)
        tracker.log({"train": {"loss": 0.25}}, step=3)  # the same step again is allowed
        tracker.log({}, step=4)  # nothing to write: no rows
    assert written == {"train/loss": 0.5, "train/tinker_x": 2.0}
    assert WRITTEN == [
        ("list", "log", written, 3),
        ("other", "log", written, 3),
        ("list", "log", {"train/loss": 0.25}, 3),
        ("other", "log", {"train/loss": 0.25}, 3),
        ("list", "close", {}, -1),
        ("other", "close", {}, -1),
    ]
    _, settings = BUILT[0]
    assert settings.project == "p" and settings.run_name == tmp_path.name
    assert settings.config == {"lr": 1e-3, "out": str(tmp_path)}  # JSON-like values


def test_steps_must_be_non_negative_integers_that_never_go_back(tmp_path):
    tracker = RunTracker("list", tmp_path)
    tracker.log({"x": 1}, step=5)
    for bad in (4, -1, 2.0, True):
        with pytest.raises(InvalidRequestError):
            tracker.log({"x": 1}, step=bad)  # type: ignore[arg-type]
    assert [w[3] for w in WRITTEN] == [5]


def test_a_tracker_failing_while_logging_is_named_once_and_the_others_keep_writing(
    tmp_path, caplog
):
    with caplog.at_level(logging.ERROR), RunTracker("broken,list", tmp_path) as tracker:
        tracker.log({"x": 1}, step=0)
        tracker.log({"x": 2}, step=1)
        assert tracker.failed == {"broken": "OSError: disk full"}
    assert [(w[0], w[1], w[3]) for w in WRITTEN] == [
        ("list", "log", 0),
        ("list", "log", 1),
        ("list", "close", -1),
    ]
    assert sum("'broken' failed" in r.getMessage() for r in caplog.records) == 1


def test_unknown_names_fail_before_any_tracker_starts_and_list_the_installed(tmp_path):
    with pytest.raises(UnknownPluginError) as caught:
        RunTracker("list,tensorbaord", tmp_path)
    assert "tracker 'tensorbaord' (config field report_to)" in str(caught.value)
    assert "Installed: bad, broken, list, other" in str(caught.value)
    assert BUILT == []


def test_a_tracker_that_cannot_start_closes_the_ones_already_started(tmp_path):
    with pytest.raises(RuntimeError, match="cannot start"):
        RunTracker("list,bad", tmp_path)
    assert WRITTEN == [("list", "close", {}, -1)]


def test_the_builtin_trackers_come_from_the_trackers_plugin():
    set_registry(None)
    assert {"tensorboard", "mlflow", "wandb"} <= set(get_registry().names("tracker"))
