"""The job table's append-only log: one JSON line per change of one job, replayed on load.

The log sits beside the snapshot (``job_table.json``). Its first line names the snapshot it
extends (``{"log_id": ...}``); each further line is one job's change since the previous line
about it: a new job (its whole record), or the fields that changed, with the request-id
ledger as a delta (ids dropped, ids put). An append costs the size of the change, never the
size of the table. A line cut short by a crash is the log's end; it is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from arctic_platform.rl.errors import JobLogError

LOG_FILE = "job_table.log"
COMPACT_AFTER_BYTES = 1 << 20
"""A log past this size is folded into a fresh snapshot (and emptied) at the next change."""


def log_path(run_dir: Path) -> Path:
    """Where the job-table log of the server with ``run_dir`` lives."""
    return Path(run_dir) / LOG_FILE


def _ids_delta(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """The request-id ledger change from ``old`` to ``new``: keys to drop, then records to put.

    A put record replaces the one with its key in place, or is appended when there is none;
    a record that moved to the end (a key applied again) is dropped and put.
    """
    before = {r["key"]: r for r in old}
    new_keys = {r["key"] for r in new}
    kept = [r["key"] for r in old if r["key"] in new_keys]
    same = 0
    while same < min(len(kept), len(new)) and kept[same] == new[same]["key"]:
        same += 1
    drop = [r["key"] for r in old if r["key"] not in new_keys] + kept[same:]
    put = [r for r in new[:same] if r != before[r["key"]]] + new[same:]
    delta: dict[str, Any] = {}
    if drop:
        delta["drop"] = drop
    if put:
        delta["put"] = put
    return delta


def change(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """The log entry taking one job's record ``old`` (JSON form) to ``new``; None if equal."""
    if old is None:
        return {"job_id": new["job_id"], "new": new}
    fields = {k: v for k, v in new.items() if k != "request_ids" and old.get(k) != v}
    ids = _ids_delta(old.get("request_ids", []), new.get("request_ids", []))
    if not fields and not ids:
        return None
    entry: dict[str, Any] = {"job_id": new["job_id"]}
    if fields:
        entry["set"] = fields
    if ids:
        entry["ids"] = ids
    return entry


def apply(table: dict[str, Any], entry: dict[str, Any]) -> None:
    """Apply one log entry to ``table`` (the snapshot's JSON form), in place."""
    if "next_job_id" in entry:
        table["next_job_id"] = max(int(table.get("next_job_id", 1)), int(entry["next_job_id"]))
    if "job_id" not in entry:
        return
    jobs: list[dict[str, Any]] = table.setdefault("jobs", [])
    job_id = entry["job_id"]
    if "new" in entry:
        jobs[:] = [j for j in jobs if j["job_id"] != job_id]
        jobs.append(dict(entry["new"]))
        return
    job = next((j for j in jobs if j["job_id"] == job_id), None)
    if job is None:
        raise JobLogError(f"a change of job {job_id}, which the table does not hold")
    job.update(entry.get("set", {}))
    ids = entry.get("ids", {})
    drop = set(ids.get("drop", []))
    records = [r for r in job.get("request_ids", []) if r["key"] not in drop]
    for record in ids.get("put", []):
        at = next((i for i, r in enumerate(records) if r["key"] == record["key"]), None)
        if at is None:
            records.append(record)
        else:
            records[at] = record
    job["request_ids"] = records


def read_log(run_dir: Path, log_id: str | None) -> list[dict[str, Any]]:
    """The entries of the log that extends the snapshot ``log_id`` (none for another one).

    The last line is ignored when a crash cut it short (no newline, or not JSON); a bad line
    before it is a ``JobLogError``.
    """
    try:
        data = log_path(run_dir).read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]  # what follows the last newline was never finished
    parsed: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        try:
            value = json.loads(line)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if number == len(lines):
                break  # torn by a crash: the log ends before it
            raise JobLogError(
                f"line {number} of {log_path(run_dir)} is not a change: {exc}"
            ) from None
        parsed.append(value)
    if not parsed or log_id is None or parsed[0].get("log_id") != log_id:
        return []  # an older log, left by a crash during compaction: already in the snapshot
    return parsed[1:]


class LogWriter:
    """Appends entries to a new log for the snapshot ``log_id``; each append is fsynced."""

    def __init__(self, run_dir: Path, log_id: str) -> None:
        path = log_path(run_dir)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self.size = 0
        self.append({"log_id": log_id})
        _sync_dir(path.parent)

    def append(self, entry: dict[str, Any]) -> int:
        """Write ``entry`` as one line and make it durable; returns the bytes written."""
        line = (json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fdatasync(self._fd)
        self.size += len(line)
        return len(line)

    def close(self) -> None:
        """Close the file (the log stays on disk)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _sync_dir(directory: Path) -> None:
    """Make a file created or replaced in ``directory`` survive a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "COMPACT_AFTER_BYTES",
    "LOG_FILE",
    "JobLogError",
    "LogWriter",
    "apply",
    "change",
    "log_path",
    "read_log",
]
