"""``SessionStore``: agent sessions in memory, each with a secret key and an expiry time
(``SessionJournal`` keeps them on disk for ``serve --resume``; ``restore`` takes them back)."""

from __future__ import annotations

import builtins
import secrets
import threading
import time
from collections.abc import Callable

from pydantic import BaseModel

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.models import SessionState
from arctic_platform.rl.agents.session import AgentSession
from arctic_platform.rl.errors import NotFoundError


class OpenedSession(BaseModel):
    """A new session's id and key (the key is shown only here)."""

    session_id: str
    key: str


class SessionStore:
    """Thread-safe sessions by id; ``tokenizer_for(model)`` gives each model's tokenizer."""

    def __init__(
        self,
        tokenizer_for: Callable[[str], ChatTokenizer],
        *,
        default_ttl: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tokenizer_for = tokenizer_for
        self._default_ttl = default_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, AgentSession] = {}
        self._keys: dict[str, str] = {}

    def open(
        self, model: str, *, max_staleness: int | None = None, ttl: float | None = None
    ) -> OpenedSession:
        """Open a session on ``model`` that expires ``ttl`` seconds from now."""
        tokenizer = self._tokenizer_for(model)
        now = self._clock()
        ttl = self._default_ttl if ttl is None else ttl
        session_id = secrets.token_hex(8)
        key = secrets.token_urlsafe(24)
        state = SessionState(
            session_id=session_id,
            model=model,
            max_staleness=max_staleness,
            created_at=now,
            ttl=ttl,
            expires_at=now + ttl,
        )
        with self._lock:
            self._sessions[session_id] = AgentSession(state, tokenizer)
            self._keys[session_id] = key
        return OpenedSession(session_id=session_id, key=key)

    def restore(self, state: SessionState, key: str) -> AgentSession:
        """Take back a session an earlier server had (its turns, key and settings); its
        expiry starts again from now (the time the server was down does not count)."""
        tokenizer = self._tokenizer_for(state.model)
        ttl = self._default_ttl if state.ttl is None else state.ttl
        state = state.model_copy(update={"expires_at": self._clock() + ttl})
        session = AgentSession(state, tokenizer)
        with self._lock:
            self._sessions[state.session_id] = session
            self._keys[state.session_id] = key
        return session

    def key_of(self, session_id: str) -> str:
        """The key of the open session ``session_id`` (for its journal)."""
        with self._lock:
            key = self._keys.get(session_id)
        if key is None:
            raise NotFoundError(f"no agent session {session_id!r}")
        return key

    def get(self, session_id: str, key: str | None = None) -> AgentSession:
        """The session ``session_id`` (checked against ``key`` when one is given)."""
        with self._lock:
            session = self._sessions.get(session_id)
            known = self._keys.get(session_id)
        if session is None or known is None:
            raise NotFoundError(f"no agent session {session_id!r}")
        if key is not None and not secrets.compare_digest(key, known):
            raise NotFoundError(f"no agent session {session_id!r}")
        return session

    def touch(self, session_id: str, ttl: float | None = None) -> None:
        """Push the session's expiry ``ttl`` seconds (by default its own ttl) past now."""
        state = self.get(session_id).state
        ttl = ttl if ttl is not None else state.ttl
        state.expires_at = self._clock() + (self._default_ttl if ttl is None else ttl)

    def list(self) -> list[SessionState]:
        """Every open session's state, without turns."""
        with self._lock:
            sessions = list(self._sessions.values())
        return [s.state.model_copy(update={"turns": []}) for s in sessions]

    def close(self, session_id: str) -> SessionState:
        """Close a session; returns its final state."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            self._keys.pop(session_id, None)
        if session is None:
            raise NotFoundError(f"no agent session {session_id!r}")
        return session.state

    def expire(self, now: float | None = None) -> builtins.list[str]:
        """Close every session whose expiry is at or before ``now``; returns their ids."""
        now = self._clock() if now is None else now
        with self._lock:
            gone = [
                sid
                for sid, s in self._sessions.items()
                if s.state.expires_at is not None and s.state.expires_at <= now
            ]
            for sid in gone:
                self._sessions.pop(sid)
                self._keys.pop(sid, None)
        return gone
