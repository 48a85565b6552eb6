"""The server's durable job table: a JSON snapshot in its run directory, plus a change log.

It holds what a restarted server needs to bring its jobs back with the same ids (configs,
states, checkpoints, weight versions, request ids, the next id) and the settings it was
served with. The snapshot is written atomically (temp file, fsync, ``os.replace``); each
later change of a job is one fsynced line appended to ``job_table.log`` (``job_log``), and
``load_table`` replays it. Both are readable by the owner only and never hold a token.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arctic_platform.rl.errors import JobTableError
from arctic_platform.rl.server import job_log
from arctic_platform.rl.server.ledger import (  # the ledger's old home: names kept
    REQUEST_IDS_KEPT,
    RequestIdRecord,
    RolledBackError,
    ledger_entry,
    remember_request,
    replay_request,
    roll_back_requests,
)

STATE_FILE = "job_table.json"
FORMAT_VERSION: Literal[1] = 1
_SECRET_KEYS = frozenset(
    {"token", "auth_token", "access_token", "api_token", "api_key", "secret", "password", "pat"}
)


class JobRecord(BaseModel):
    """One job as the table stores it."""

    model_config = ConfigDict(extra="forbid")

    job_id: int = Field(ge=1)
    job_type: Literal["training", "sampling", "log_prob"]
    engine: str
    config: dict[str, Any]
    num_gpus: int = Field(ge=1)
    state: Literal[
        "pending", "placing", "initializing", "running", "failed", "cancelled", "terminated"
    ]
    reason: str | None = None
    latest_checkpoint: str | None = None
    checkpoints: dict[str, int] = Field(default_factory=dict)
    """Path -> step, oldest save first."""
    weight_version: int = Field(default=0, ge=0)
    weights_from: str | None = None
    synced_from: int | None = None
    synced_adapter: str | None = None
    adapter_versions: dict[str, int] = Field(default_factory=dict)
    global_step: int = Field(default=0, ge=0)
    colocation_group: str | None = None
    restarts: int = Field(default=0, ge=0)
    request_ids: list[RequestIdRecord] = Field(default_factory=list)
    created_at: float
    updated_at: float

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _step_keyed_catalog(cls, value: Any) -> Any:
        """Tables written before a step could hold several checkpoints kept step -> path."""
        if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
            return {path: int(step) for step, path in value.items()}
        return value


class JobTable(BaseModel):
    """Every job of a server, the next job id, and the settings to serve again with."""

    model_config = ConfigDict(extra="forbid")

    format_version: Literal[1] = FORMAT_VERSION
    next_job_id: int = Field(default=1, ge=1)
    server: dict[str, Any] = Field(default_factory=dict)
    jobs: list[JobRecord] = Field(default_factory=list)
    log_id: str | None = None
    """The change log that extends this snapshot (a log naming another id is stale)."""


def scrub(value: Any) -> Any:
    """``value`` with every secret-looking key (token, password, ...) removed, recursively."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if str(k).lower() not in _SECRET_KEYS}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def state_path(run_dir: Path) -> Path:
    """Where the job table of the server with ``run_dir`` lives."""
    return Path(run_dir) / STATE_FILE


def save_table(run_dir: Path, table: JobTable) -> Path:
    """Write ``table`` atomically with mode 0600 and drop the change log it supersedes.

    A crash leaves the old or the new snapshot; a log left beside the new one names the old
    snapshot, so it is not replayed.
    """
    path = state_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(scrub(table.model_dump()), indent=1, sort_keys=True)  # NaN stays NaN
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    job_log.log_path(run_dir).unlink(missing_ok=True)
    return path


def load_table(run_dir: Path) -> JobTable | None:
    """The job table in ``run_dir``, or None when there is none; JobTableError if it is bad."""
    path = state_path(run_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JobTableError(f"cannot read the job table {path}: {exc}") from None
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            for entry in job_log.read_log(run_dir, data.get("log_id")):
                job_log.apply(data, entry)
        return JobTable.model_validate(data)
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            from arctic_platform.rl.wire import describe_errors

            why = describe_errors(exc)
        else:
            why = str(exc)
        raise JobTableError(f"{path} is not a valid job table: {why}") from None
    except (KeyError, TypeError) as exc:
        log = job_log.log_path(run_dir)
        raise JobTableError(f"{log} holds a change that does not fit {path}: {exc!r}") from None


class JobJournal:
    """Keeps the job table on disk: a snapshot at ``compact``, one log line per job change.

    ``append`` costs the size of one job's change (not the table's); it answers False when
    the table must be compacted instead (nothing written yet by this process, or the log
    past ``limit_bytes``). Callers serialise calls.
    """

    def __init__(self, run_dir: Path, limit_bytes: int = job_log.COMPACT_AFTER_BYTES) -> None:
        self.run_dir = Path(run_dir)
        self.limit_bytes = limit_bytes
        self._writer: job_log.LogWriter | None = None
        self._written: dict[int, dict[str, Any]] = {}
        self._next_job_id = 1

    def compact(self, table: JobTable) -> None:
        """Write ``table`` as the new snapshot and start an empty log that extends it."""
        self.close()
        log_id = uuid.uuid4().hex
        save_table(self.run_dir, table.model_copy(update={"log_id": log_id}))
        self._written = {r.job_id: _json_record(r) for r in table.jobs}
        self._next_job_id = table.next_job_id
        self._writer = job_log.LogWriter(self.run_dir, log_id)

    def append(self, record: JobRecord, next_job_id: int) -> bool:
        """Log what changed in ``record`` since it was last written; False: compact instead."""
        writer = self._writer
        if writer is None or writer.size > self.limit_bytes:
            return False
        new = _json_record(record)
        entry = job_log.change(self._written.get(record.job_id), new)
        if next_job_id != self._next_job_id:
            entry = {**(entry or {}), "next_job_id": next_job_id}
        if entry is not None:
            try:
                writer.append(entry)
            except OSError:  # a line may be half written: the next change compacts
                self.close()
                raise
        self._written[record.job_id] = new
        self._next_job_id = next_job_id
        return True

    @property
    def log_bytes(self) -> int:
        """Bytes in the current log (0 before the first compaction)."""
        return self._writer.size if self._writer is not None else 0

    def close(self) -> None:
        """Stop appending; the next change compacts."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _json_record(record: JobRecord) -> dict[str, Any]:
    """``record`` as the journal writes it; python mode, so a NaN or infinite loss stays a float
    (JSON mode makes it ``null``) and ``json`` writes it as ``NaN``/``Infinity``."""
    result: dict[str, Any] = scrub(record.model_dump())
    return result


__all__ = [
    "REQUEST_IDS_KEPT",
    "JobJournal",
    "JobRecord",
    "JobTable",
    "JobTableError",
    "RequestIdRecord",
    "RolledBackError",
    "ledger_entry",
    "load_table",
    "remember_request",
    "replay_request",
    "roll_back_requests",
    "save_table",
    "scrub",
    "state_path",
]
