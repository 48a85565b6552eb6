"""``SessionJournal``: agent sessions on disk, so that ``serve --resume`` brings them back.

One append-only JSON-lines file per session in the server's run dir (``sessions/<id>.jsonl``,
private: it holds the session key): an ``open`` line (the state without turns, the key, the
sampling job), then a ``turns`` line per request (the turns it recorded and the history the
next request must re-send). Closing or expiring a session deletes its file. A line torn by a
crash is skipped when the file is read back, with the turns before it kept.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from arctic_platform.rl.agents.models import RequestRecord, SessionState, SessionTurn

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl"


class JournaledSession(BaseModel):
    """A session read back from its file: its state (with turns), key and sampling job."""

    state: SessionState
    key: str
    job_id: int


class SessionJournal:
    """Writes and reads back the sessions of one server's run dir (``directory``)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()

    def _path(self, session_id: str) -> Path:
        if not session_id.isalnum():  # ids are hex; never a path of the caller's choosing
            raise ValueError(f"not a session id: {session_id!r}")
        return self.directory / f"{session_id}{SUFFIX}"

    def _append(self, session_id: str, record: dict[str, Any], *, create: bool = False) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        path = self._path(session_id)
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_TRUNC if create else 0)
        with self._lock:
            if create:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            elif not path.exists():
                return  # closed or expired meanwhile: nothing to add to
            fd = os.open(path, flags, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

    def opened(self, state: SessionState, key: str, job_id: int) -> None:
        """A new session: its file, with the state (no turns), key and sampling job."""
        head = state.model_dump(mode="json", exclude={"turns"})
        self._append(state.session_id, {"open": head, "key": key, "job_id": job_id}, create=True)

    def recorded(self, state: SessionState, turns: list[SessionTurn]) -> None:
        """A request's turns and its ``RequestRecord`` (the messages it added, its tools)."""
        indices = [t.index for t in turns]
        request = next(r for r in reversed(state.requests) if r.turns == indices)
        record = {
            "turns": [t.model_dump(mode="json") for t in turns],
            "request": request.model_dump(mode="json"),
        }
        self._append(state.session_id, record)

    def closed(self, session_id: str) -> None:
        """The session is gone (closed or expired): its file too."""
        with self._lock:
            self._path(session_id).unlink(missing_ok=True)

    def clear(self) -> None:
        """Forget every session on disk (a server that does not resume starts without them)."""
        with self._lock:
            for path in self.directory.glob(f"*{SUFFIX}"):
                path.unlink(missing_ok=True)

    def load(self) -> list[JournaledSession]:
        """Every session on disk, its turns replayed; unreadable files are logged and skipped."""
        out = []
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            try:
                out.append(self._read(path))
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("agent session file %s cannot be read back (%s): skipped", path, exc)
        return out

    @staticmethod
    def _read(path: Path) -> JournaledSession:
        lines = path.read_text().splitlines()
        head = json.loads(lines[0])
        state = SessionState.model_validate(head["open"])
        turns: list[SessionTurn] = []
        requests: list[RequestRecord] = []
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                recorded = [SessionTurn.model_validate(t) for t in record["turns"]]
                requests.append(_request(record, recorded))
            except (ValueError, KeyError) as exc:  # a torn last write: keep what came before
                logger.warning("%s line %d is torn (%s): earlier turns kept", path, number, exc)
                break
            turns.extend(recorded)
        # requests recorded together may have been written in either order; a torn line
        # among them leaves a gap: the turns before it are kept
        turns.sort(key=lambda t: t.index)
        kept = next((n for n, t in enumerate(turns) if t.index != n), len(turns))
        state.turns = turns[:kept]
        state.requests = sorted(
            (r for r in requests if all(t < kept for t in r.turns)),
            key=lambda r: min(r.turns, default=-1),
        )
        used = [t.segment + 1 for t in state.turns]
        state.next_segment = max([state.next_segment, *used])
        return JournaledSession(state=state, key=str(head["key"]), job_id=int(head["job_id"]))


def _request(record: dict[str, Any], turns: list[SessionTurn]) -> RequestRecord:
    """A line's ``RequestRecord``; a line of a server before them (``last_messages``: the
    request's whole history) becomes a record that began its segment."""
    if "request" in record:
        return RequestRecord.model_validate(record["request"])
    messages = record.get("last_messages") or []
    return RequestRecord(
        turns=[t.index for t in turns],
        messages=messages,
        tools=record.get("last_tools"),
        chat=bool(messages),
    )


__all__ = ["JournaledSession", "SessionJournal"]
