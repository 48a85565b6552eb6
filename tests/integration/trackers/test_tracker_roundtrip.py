"""RunTracker writes to the real tensorboard, mlflow and wandb libraries, and each library's own
reader finds every value at its step (wandb offline; MLflow on a file store in the run dir)."""

from __future__ import annotations

import math

import pytest
from support.tracker_readers import (
    read_mlflow,
    read_tensorboard,
    read_wandb,
    wandb_run_file,
)

from arctic_platform.rl import RunTracker
from arctic_platform.rl.errors import InvalidRequestError

pytestmark = pytest.mark.slow

# what a loop hands over: our calls' answers nested under its own names, plus its own numbers
STEPS = [
    (0, {"train": {"loss": 0.75, "mismatch_k3": 1.5e-7, "batch_tokens": 96}, "reward": 0.25}),
    (1, {"train": {"loss": 0.5, "mismatch_k3": 2.5e-7, "batch_tokens": 90}, "reward": 0.5}),
    (3, {"train": {"loss": 0.25, "kl_sample_train_v1:mean": 0.125}, "optim": {"lr": 1e-3}}),
]
EXPECTED = {
    "train/loss": [(0, 0.75), (1, 0.5), (3, 0.25)],
    "train/mismatch_k3": [(0, 1.5e-7), (1, 2.5e-7)],
    "train/batch_tokens": [(0, 96.0), (1, 90.0)],
    "reward": [(0, 0.25), (1, 0.5)],
    "train/kl_sample_train_v1_mean": [(3, 0.125)],
    "optim/lr": [(3, 1e-3)],
}


def _same(got: dict, expected: dict) -> None:
    assert set(got) == set(expected), sorted(got)
    for key, rows in expected.items():
        assert [s for s, _ in got[key]] == [s for s, _ in rows], key
        for (_, a), (_, b) in zip(got[key], rows, strict=True):
            # tensorboard keeps float32
            assert math.isclose(a, b, rel_tol=1e-6), (key, a, b)


@pytest.fixture(scope="module")
def written(tmp_path_factory, monkeypatch_module):
    log_dir = tmp_path_factory.mktemp("run")
    monkeypatch_module.setenv("WANDB_MODE", "offline")
    monkeypatch_module.setenv("WANDB_SILENT", "true")
    monkeypatch_module.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"learning_rate": 1e-3, "loss": "grpo", "training": {"lora": {"rank": 8}}}
    with RunTracker(
        "tensorboard, mlflow ,wandb", log_dir, project="roundtrip", config=config
    ) as tracker:
        for step, metrics in STEPS:
            tracker.log(metrics, step=step)
        with pytest.raises(InvalidRequestError, match="must not go back"):
            tracker.log({"x": 1.0}, step=2)
        assert tracker.failed == {}
    return log_dir


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_tensorboard_event_files_hold_every_value(written):
    _same(read_tensorboard(written / "tensorboard"), EXPECTED)


def test_the_mlflow_run_holds_every_value_and_the_config(written):
    series, params = read_mlflow((written / "mlruns").resolve().as_uri(), "roundtrip")
    _same(series, EXPECTED)
    assert params == {"learning_rate": "0.001", "loss": "grpo", "training.lora.rank": "8"}


def test_the_offline_wandb_run_holds_every_value_and_the_config(written):
    series, config = read_wandb(wandb_run_file(written))
    _same(series, EXPECTED)
    assert config["loss"] == "grpo" and config["training"] == {"lora": {"rank": 8}}
