"""MLflow: one run per ``RunTracker``, metrics and parameters sent in batches."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from arctic_platform.rl.api import TrackerSettings
from arctic_rl_trackers.requirement import require

MAX_BATCH = 1000  # MLflow's limit on metrics in one log_batch call
MAX_PARAM = 6000  # MLflow's limit on a parameter value's length


class MlflowTracker:
    """An MLflow run in experiment ``project`` named ``run_name``, on ``$MLFLOW_TRACKING_URI``
    when set, else on a file store in ``LOG_DIR/mlruns`` (``mlflow ui --backend-store-uri``
    reads it); the configuration becomes the run's parameters (nested keys joined by dots)."""

    def __init__(self, settings: TrackerSettings) -> None:
        tracking = require("mlflow.tracking", "mlflow", "mlflow-skinny")
        entities = require("mlflow.entities", "mlflow", "mlflow-skinny")
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (
            (settings.log_dir / "mlruns").resolve().as_uri()
        )
        if self.uri.startswith("file:"):
            # MLflow 3 keeps its file store only on request (a sqlite store needs sqlalchemy)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._metric = entities.Metric
        self.client = tracking.MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(settings.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(settings.project)
        )
        self.run_id: str = self.client.create_run(
            experiment_id, run_name=settings.run_name
        ).info.run_id
        params = [entities.Param(k, v) for k, v in _params(settings.config).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One batch of metrics (split at MLflow's batch limit) at ``step``."""
        now = int(time.time() * 1000)
        rows = [self._metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(rows), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i : i + MAX_BATCH])

    def close(self) -> None:
        """End the run as finished."""
        self.client.set_terminated(self.run_id)


def _params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(_params(value, name))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:MAX_PARAM]
    return out
