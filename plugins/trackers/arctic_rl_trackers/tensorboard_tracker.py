"""TensorBoard: scalar events written with tensorboard's own event writer (no torch needed)."""

from __future__ import annotations

import json
import time

from arctic_platform.rl.api import TrackerSettings
from arctic_rl_trackers.requirement import require


class TensorBoardTracker:
    """Writes each metric as a scalar summary to event files in ``LOG_DIR/tensorboard``; the
    run's configuration goes beside them as ``config.json``."""

    def __init__(self, settings: TrackerSettings) -> None:
        writer, protos, summaries = (
            require(f"tensorboard.{module}", "tensorboard", "tensorboard")
            for module in (
                "summary.writer.event_file_writer",
                "compat.proto.event_pb2",
                "compat.proto.summary_pb2",
            )
        )
        self.dir = settings.log_dir / "tensorboard"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(settings.config, indent=2))
        self._event = protos.Event
        self._summary = summaries.Summary
        self.writer = writer.EventFileWriter(str(self.dir), flush_secs=10)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One event at ``step`` holding every metric as a scalar."""
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        event = self._event(wall_time=time.time(), step=step, summary=self._summary(value=values))
        self.writer.add_event(event)

    def close(self) -> None:
        """Flush the event file and close it."""
        self.writer.close()
