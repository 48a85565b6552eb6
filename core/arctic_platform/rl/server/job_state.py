"""The live job record: ``JobState`` (its lifecycle) and ``Job`` (config, state, workers).

``jobs.JobManager`` and the modules it uses (placement, worker launch, failure diagnosis)
all read this record; it imports nothing of the manager, so they never import ``jobs``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from arctic_platform.rl.config import DEFAULT_ADAPTER
from arctic_platform.rl.server.job_table import JobRecord, RequestIdRecord

logger = logging.getLogger(__name__)


class JobState(StrEnum):
    """Lifecycle state of a job."""

    PENDING = "pending"
    PLACING = "placing"
    INITIALIZING = "initializing"
    RUNNING = "running"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"

    @property
    def terminal(self) -> bool:
        return self in (JobState.FAILED, JobState.CANCELLED, JobState.TERMINATED)


_RECORD_AS_IS = (
    "job_id",
    "job_type",
    "engine",
    "num_gpus",
    "reason",
    "latest_checkpoint",
    "weight_version",
    "weights_from",
    "synced_from",
    "synced_adapter",
    "adapter_versions",
    "global_step",
    "colocation_group",
    "restarts",
    "created_at",
    "updated_at",
)
"""The fields a ``Job`` and its ``JobRecord`` share as they are (the others are converted)."""


def _copied(value: Any) -> Any:
    """``value``, with a dict field copied (a record never shares one with its job)."""
    return dict(value) if isinstance(value, dict) else value


@dataclass
class Job:
    """One job: its config, state and workers."""

    job_id: int
    job_type: str
    engine: str
    config: dict[str, Any]
    num_gpus: int
    state: JobState = JobState.PENDING
    reason: str | None = None
    workers: list[Any] = field(default_factory=list)
    placement_group: Any = None
    owns_placement_group: bool = True
    weight_version: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    latest_checkpoint: str | None = None
    checkpoints: dict[str, int] = field(default_factory=dict)
    """The checkpoint catalog, path -> step, oldest save first (several paths may share a step:
    two tags saved between the same two optimizer steps)."""
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    cancel_requested: bool = False
    worker_pids: list[int] = field(default_factory=list)
    global_step: int = 0
    weights_from: str | None = None
    synced_from: int | None = None
    synced_adapter: str | None = None
    """The adapter name the last sync from ``synced_from`` loaded (None: a full-weight sync)."""
    adapter_versions: dict[str, int] = field(default_factory=dict)
    """LoRA jobs: per adapter name, the latest version synced in (versions never go back)."""
    resync_pending: list[int] = field(default_factory=list)
    """A restarted training job: the jobs still waiting for its restored weights."""
    restarts: int = 0
    request_ids: list[RequestIdRecord] = field(default_factory=list, repr=False)
    launch_overrides: dict[str, Any] = field(default_factory=dict, repr=False)
    listener: Callable[[Job], None] | None = field(default=None, repr=False)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Per worker (rank or replica order): its node's address and Ray node id."""
    colocation_group: str | None = None
    """A colocated job's set of shared GPU bundles (None: the server's default set)."""

    def node_of(self, index: int) -> str:
        """The address of worker ``index``'s node, or ``unknown``."""
        if 0 <= index < len(self.nodes):
            return str(self.nodes[index].get("address", "unknown"))
        return "unknown"

    def node_names(self) -> str:
        """The addresses of this job's worker nodes, for messages."""
        return ", ".join(sorted({str(n.get("address")) for n in self.nodes})) or "unknown"

    def adapter_version(self, adapter: str) -> int:
        """The latest version of ``adapter`` synced into this job (0: none yet); the default
        adapter's is the job's ``weight_version``, which a restart also moves on."""
        latest = self.adapter_versions.get(adapter, 0)
        return max(latest, self.weight_version) if adapter == DEFAULT_ADAPTER else latest

    def set_state(self, state: JobState, reason: str | None = None) -> None:
        """Move to ``state`` (terminal states are final) and record it in the job table."""
        if self.state.terminal:
            return
        self.state = state
        self.updated_at = time.time()
        if reason is not None:
            self.reason = reason
        self.changed()
        logger.info(
            "job %d (%s): %s%s",
            self.job_id,
            self.job_type,
            state.value,
            f" ({reason.splitlines()[0]})" if reason else "",
        )

    def changed(self) -> None:
        """Tell the job table that this job changed."""
        if self.listener is not None:
            self.listener(self)

    def record(self) -> JobRecord:
        """This job as the durable job table stores it."""
        return JobRecord(
            **{name: _copied(getattr(self, name)) for name in _RECORD_AS_IS},
            config=self.config,
            state=self.state.value,
            checkpoints=dict(self.checkpoints),
            request_ids=[r.model_copy() for r in list(self.request_ids)],
        )

    @classmethod
    def from_record(cls, record: JobRecord) -> Job:
        """A job object for ``record`` (no workers yet)."""
        return cls(
            **{name: _copied(getattr(record, name)) for name in _RECORD_AS_IS},
            config=dict(record.config),
            state=JobState(record.state),
            checkpoints=dict(record.checkpoints),
            request_ids=[r.model_copy() for r in record.request_ids],
        )

    def saved_checkpoints(self) -> list[dict[str, Any]]:
        """The checkpoint catalog, ``[{"step", "path"}]`` by step, of the entries whose
        directory exists: one deleted outside the server is not listed (nor one whose
        replacement was cut short, leaving only a hidden copy; it still loads by step)."""
        entries = sorted(self.checkpoints.items(), key=lambda item: item[1])  # stable: save order
        return [{"step": step, "path": path} for path, step in entries if Path(path).is_dir()]

    def describe(self) -> dict[str, Any]:
        """The public view of this job (no tokens, no worker handles)."""
        return {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "engine": self.engine,
            "state": self.state.value,
            "reason": self.reason,
            "num_gpus": self.num_gpus,
            "workers": len(self.workers),
            "worker_pids": list(self.worker_pids),
            "worker_nodes": [dict(n) for n in self.nodes],
            "weight_version": self.weight_version,
            "weights_from": self.weights_from,
            "adapter_versions": dict(self.adapter_versions),
            "resync_pending": list(self.resync_pending),
            "global_step": self.global_step,
            "restarts": self.restarts,
            "model_name": self.config.get("model_name"),
            "colocate": bool(self.config.get("colocate")),
            "colocation_group": self.colocation_group,
            "latest_checkpoint": self.latest_checkpoint,
            "checkpoints": self.saved_checkpoints(),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


__all__ = ["Job", "JobState"]
