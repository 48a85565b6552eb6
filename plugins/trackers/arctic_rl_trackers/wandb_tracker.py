"""Weights & Biases: one run per ``RunTracker``; offline unless wandb is set up to reach its
server."""

from __future__ import annotations

import logging
import os

from arctic_platform.rl.api import TrackerSettings
from arctic_rl_trackers.requirement import require

log = logging.getLogger(__name__)


def wandb_mode() -> str:
    """``$WANDB_MODE`` when set; else online with an API key, offline without one (wandb would
    otherwise stop the run to ask for a login)."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbTracker:
    """A wandb run in project ``project`` named ``run_name``, its files in ``LOG_DIR/wandb``
    (an offline run is uploaded later with ``wandb sync``); the configuration is the run's."""

    def __init__(self, settings: TrackerSettings) -> None:
        wandb = require("wandb", "wandb", "wandb")
        mode = wandb_mode()
        if mode == "offline":
            log.info("wandb: offline run in %s (upload it with `wandb sync`)", settings.log_dir)
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=settings.project,
            name=settings.run_name,
            dir=str(settings.log_dir),
            config=settings.config,
            mode=mode,
            reinit="create_new",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One history row at ``step``."""
        self.run.log(metrics, step=step)

    def close(self) -> None:
        """Finish the run (an offline run's file is complete after this)."""
        self.run.finish()
