"""The platform server's durable state (SQLite in its run directory): jobs, sub-jobs,
request records and notes on checkpoints (which checkpoints a training job has is core's
catalog), so a restarted server still answers for them.

Engines do not survive a restart: jobs of an earlier boot are reported ``failed`` and their
unfinished requests ``failed`` with code ``server_restarted`` (never silently dropped).
Sub-job numbers (the integer ids clients hold) are never reused, across restarts too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    owner TEXT NOT NULL, job_id TEXT NOT NULL, body TEXT NOT NULL, boot TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, cancelled INTEGER NOT NULL DEFAULT 0,
    lost_reason TEXT, PRIMARY KEY (owner, job_id));
CREATE TABLE IF NOT EXISTS sub_jobs (
    number INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, job_id TEXT NOT NULL,
    sub_job_id TEXT NOT NULL, job_type TEXT NOT NULL, engine_id INTEGER NOT NULL,
    n_gpus INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY, owner TEXT NOT NULL, job_id TEXT NOT NULL,
    operation TEXT NOT NULL, status TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, idempotency_key TEXT, error TEXT, error_code TEXT,
    error_status INTEGER, has_result INTEGER NOT NULL DEFAULT 0, fingerprint TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS requests_key ON requests (owner, job_id, idempotency_key);
CREATE TABLE IF NOT EXISTS checkpoint_notes (
    owner TEXT NOT NULL, job_id TEXT NOT NULL, path TEXT NOT NULL, avg_loss REAL,
    checkpoint_type TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (owner, job_id, path));
"""
# A database of an earlier version kept a whole checkpoint catalog; its notes are kept.
_MIGRATE_CHECKPOINTS = """
INSERT OR IGNORE INTO checkpoint_notes (owner, job_id, path, avg_loss, checkpoint_type, created_at)
    SELECT owner, job_id, path, avg_loss, checkpoint_type, created_at FROM checkpoints;
DROP TABLE checkpoints;
"""


@dataclass(frozen=True)
class SubJobRow:
    """One sub-job: its wire id, Arctic RL job type, client number and engine job id."""

    number: int
    owner: str
    job_id: str
    sub_job_id: str
    job_type: str
    engine_id: int
    n_gpus: int


@dataclass(frozen=True)
class JobRow:
    """One platform job as stored."""

    owner: str
    job_id: str
    body: dict[str, Any]
    boot: str
    created_at: float
    updated_at: float
    cancelled: bool
    lost_reason: str | None


class Store:
    """Thread-safe access to the SQLite file; one instance per server process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.results_dir = self.path.parent / "results"
        self.results_dir.mkdir(exist_ok=True)
        self.boot = uuid.uuid4().hex[:12]
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.RLock()
        with self._lock:
            self._db.executescript(_SCHEMA)
            old = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'"
            ).fetchone()
            if old is not None:
                try:
                    self._db.executescript(f"BEGIN; {_MIGRATE_CHECKPOINTS} COMMIT;")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
        self._recover()

    def _recover(self) -> None:
        """Mark what an earlier boot left unfinished as failed (engines died with it)."""
        now = time.time()
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET lost_reason = ?, updated_at = ? WHERE boot != ? AND cancelled = 0 "
                "AND lost_reason IS NULL",
                (
                    "the platform server restarted; this job's engines stopped with it (its "
                    "checkpoints are kept; create a new job to go on)",
                    now,
                    self.boot,
                ),
            )
            self._db.execute(
                "UPDATE requests SET status = 'failed', error = ?, error_code = 'server_restarted',"
                " error_status = 503, updated_at = ? WHERE status IN ('pending', 'running')",
                (
                    "the platform server stopped while this request was in flight; its result "
                    "is lost (it may or may not have been applied before the stop)",
                    now,
                ),
            )

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """The first row ``sql`` selects (None: no row), read under the lock."""
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Every row ``sql`` selects, read under the lock."""
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """Run one statement that changes the database, under the lock."""
        with self._lock:
            self._db.execute(sql, params)

    # --- jobs ---------------------------------------------------------------------------

    def job_exists(self, owner: str, job_id: str) -> bool:
        """Whether ``owner`` has a job ``job_id`` (from any boot)."""
        row = self._one("SELECT 1 FROM jobs WHERE owner = ? AND job_id = ?", (owner, job_id))
        return row is not None

    def add_job(
        self, owner: str, job_id: str, body: dict[str, Any], subs: list[tuple[str, str, int, int]]
    ) -> list[SubJobRow]:
        """Insert a job and its sub-jobs ``(sub_job_id, job_type, engine_id, n_gpus)``."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute(
                    "INSERT INTO jobs (owner, job_id, body, boot, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (owner, job_id, json.dumps(body), self.boot, now, now),
                )
                for sub_job_id, job_type, engine_id, gpus in subs:
                    self._db.execute(
                        "INSERT INTO sub_jobs (owner, job_id, sub_job_id, job_type, engine_id, "
                        "n_gpus) VALUES (?, ?, ?, ?, ?, ?)",
                        (owner, job_id, sub_job_id, job_type, engine_id, gpus),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self.sub_jobs(owner, job_id)

    def _job(self, row: tuple[Any, ...]) -> JobRow:
        return JobRow(
            row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], bool(row[6]), row[7]
        )

    def job(self, owner: str, job_id: str) -> JobRow | None:
        """The job, or None when ``owner`` has no job of that id."""
        row = self._one(
            "SELECT owner, job_id, body, boot, created_at, updated_at, cancelled, lost_reason "
            "FROM jobs WHERE owner = ? AND job_id = ?",
            (owner, job_id),
        )
        return None if row is None else self._job(row)

    def jobs(self, owner: str | None) -> list[JobRow]:
        """Every job of ``owner`` (all users' with None), oldest first."""
        query = (
            "SELECT owner, job_id, body, boot, created_at, updated_at, cancelled, lost_reason "
            "FROM jobs"
        )
        if owner is None:
            rows = self._all(query + " ORDER BY created_at")
        else:
            rows = self._all(query + " WHERE owner = ? ORDER BY created_at", (owner,))
        return [self._job(r) for r in rows]

    def mark_cancelled(self, owner: str, job_id: str) -> None:
        """Record that the owner cancelled the job."""
        self._write(
            "UPDATE jobs SET cancelled = 1, updated_at = ? WHERE owner = ? AND job_id = ?",
            (time.time(), owner, job_id),
        )

    # --- sub-jobs -----------------------------------------------------------------------

    def _sub(self, row: tuple[Any, ...]) -> SubJobRow:
        return SubJobRow(*row)

    _SUB = "SELECT number, owner, job_id, sub_job_id, job_type, engine_id, n_gpus FROM sub_jobs"

    def sub_jobs(self, owner: str, job_id: str) -> list[SubJobRow]:
        """The sub-jobs of a job in creation order."""
        rows = self._all(
            self._SUB + " WHERE owner = ? AND job_id = ? ORDER BY number", (owner, job_id)
        )
        return [self._sub(r) for r in rows]

    def sub_job_by_number(self, owner: str, number: int) -> SubJobRow | None:
        """The owner's sub-job with client number ``number`` (None for anyone else's)."""
        row = self._one(self._SUB + " WHERE owner = ? AND number = ?", (owner, number))
        return None if row is None else self._sub(row)

    # --- requests -----------------------------------------------------------------------

    def add_request(
        self,
        owner: str,
        job_id: str,
        operation: str,
        idempotency_key: str | None,
        fingerprint: str | None = None,
    ) -> tuple[str, bool]:
        """A new pending request id, or ``(existing id, True)`` when the key was seen."""
        with self._lock:
            if idempotency_key is not None:
                row = self._db.execute(
                    "SELECT request_id FROM requests WHERE owner = ? AND job_id = ? AND "
                    "idempotency_key = ?",
                    (owner, job_id, idempotency_key),
                ).fetchone()
                if row is not None:
                    return str(row[0]), True
            request_id = uuid.uuid4().hex
            now = time.time()
            self._db.execute(
                "INSERT INTO requests (request_id, owner, job_id, operation, status, created_at, "
                "updated_at, idempotency_key, fingerprint) VALUES "
                "(?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
                (request_id, owner, job_id, operation, now, now, idempotency_key, fingerprint),
            )
        return request_id, False

    def request_for_key(self, owner: str, job_id: str, key: str) -> tuple[str, str | None] | None:
        """``(request id, fingerprint)`` of the job's request made with ``key``, if any."""
        row = self._one(
            "SELECT request_id, fingerprint FROM requests WHERE owner = ? AND job_id = ? AND "
            "idempotency_key = ?",
            (owner, job_id, key),
        )
        return None if row is None else (str(row[0]), row[1])

    def set_request(self, request_id: str, status: str, **fields: Any) -> None:
        """Move a request to ``status`` with optional error fields / ``has_result``."""
        allowed = {"error", "error_code", "error_status", "has_result"}
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._write(
            f"UPDATE requests SET status = ?, updated_at = ?{', ' + sets if sets else ''} "
            "WHERE request_id = ?",
            (status, time.time(), *fields.values(), request_id),
        )

    def reopen_request(self, request_id: str) -> bool:
        """Move an ended request back to ``pending`` to run it again (its error and result
        cleared); False when it is still pending or running."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE requests SET status = 'pending', updated_at = ?, error = NULL, "
                "error_code = NULL, error_status = NULL, has_result = 0 WHERE request_id = ? "
                "AND status IN ('done', 'failed', 'cancelled')",
                (time.time(), request_id),
            )
        return cursor.rowcount == 1

    _REQ = (
        "SELECT request_id, owner, job_id, operation, status, created_at, updated_at, "
        "idempotency_key, error, error_code, error_status, has_result FROM requests"
    )

    @staticmethod
    def _req(row: tuple[Any, ...]) -> dict[str, Any]:
        keys = (
            "request_id owner job_id operation status created_at updated_at idempotency_key "
            "error error_code error_status has_result"
        ).split()
        return dict(zip(keys, row, strict=True))

    def request(self, owner: str, job_id: str, request_id: str) -> dict[str, Any] | None:
        """The record, or None unless it belongs to this owner's job."""
        row = self._one(
            self._REQ + " WHERE owner = ? AND job_id = ? AND request_id = ?",
            (owner, job_id, request_id),
        )
        return None if row is None else self._req(row)

    def requests(self, owner: str, job_id: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The job's request records, newest first."""
        rows = self._all(
            self._REQ + " WHERE owner = ? AND job_id = ? ORDER BY created_at DESC LIMIT ?",
            (owner, job_id, limit),
        )
        return [self._req(r) for r in rows]

    def result_path(self, request_id: str) -> Path:
        """Where a done request's result frame is kept."""
        return self.results_dir / f"{request_id}.frame"

    # --- checkpoint notes -------------------------------------------------------------

    def add_checkpoint_note(
        self, owner: str, job_id: str, path: str, avg_loss: float | None, checkpoint_type: str
    ) -> None:
        """Note what the platform knows of the checkpoint at ``path`` (core's catalog has its
        step): the loss of the last forward-backward before it, its type, when it was saved."""
        self._write(
            "INSERT OR REPLACE INTO checkpoint_notes (owner, job_id, path, avg_loss, "
            "checkpoint_type, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (owner, job_id, path, avg_loss, checkpoint_type, time.time()),
        )

    def checkpoint_notes(self, owner: str, job_id: str) -> dict[str, dict[str, Any]]:
        """The job's checkpoint notes by path."""
        rows = self._all(
            "SELECT path, avg_loss, checkpoint_type, created_at FROM checkpoint_notes "
            "WHERE owner = ? AND job_id = ?",
            (owner, job_id),
        )
        keys = ("avg_loss", "checkpoint_type", "created_at")
        return {str(r[0]): dict(zip(keys, r[1:], strict=True)) for r in rows}

    def delete_checkpoint_note(self, owner: str, job_id: str, path: str) -> None:
        """Forget the note of the checkpoint at ``path``."""
        self._write(
            "DELETE FROM checkpoint_notes WHERE owner = ? AND job_id = ? AND path = ?",
            (owner, job_id, path),
        )
