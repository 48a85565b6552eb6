"""The ``example-csv`` tracker: every metric as a ``step,name,value`` row of a CSV file."""

from __future__ import annotations

import csv

from arctic_platform.rl.api import TrackerSettings


class CsvTracker:
    """Writes ``LOG_DIR/example-tracker.csv``; its first row names the run and project."""

    def __init__(self, settings: TrackerSettings) -> None:
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        self.file = (settings.log_dir / "example-tracker.csv").open("w", newline="")
        self.rows = csv.writer(self.file)
        self.rows.writerow(["run", settings.project, settings.run_name])

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One row per metric."""
        for name, value in metrics.items():
            self.rows.writerow([step, name, repr(value)])

    def close(self) -> None:
        """Close the file."""
        self.file.close()
