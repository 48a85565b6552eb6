"""``SessionMethods``: the agent-session methods of ``ArcticRLClient`` (a mixin): open a
session on the run's sampling job, read its trajectory, close it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from arctic_platform.rl.errors import InvalidRequestError


class SessionHandle(BaseModel):
    """An open agent session: give ``base_url`` and ``api_key`` to any OpenAI client.

    Over http ``base_url`` is the client's server address + ``base_url_path``; over a transport
    that is not HTTP (ray) it is where the server serves the session routes beside it."""

    session_id: str
    api_key: str
    base_url: str | None
    base_url_path: str
    model: str
    job_id: int
    expires_at: float | None = None


class SessionMethods:
    """Agent sessions on the client's sampling job (mixed into ``ArcticRLClient``)."""

    transport: Any
    job_ids: dict[str, int | None]

    def open_session(
        self, *, max_staleness: int | None = None, ttl: float | None = None
    ) -> SessionHandle:
        """Open an agent session on the sampling job; turns older than ``max_staleness``
        weight versions are refused, and it expires ``ttl`` s after its last use."""
        job_id = self.job_ids.get("sampling")
        if job_id is None:
            raise InvalidRequestError(
                "this client has no sampling job to open a session on (sampling_gpus=0)"
            )
        payload: dict[str, Any] = {"job_id": job_id}
        if max_staleness is not None:
            payload["max_staleness"] = max_staleness
        if ttl is not None:
            payload["ttl"] = ttl
        answer = dict(self.transport.call("open_session", payload))
        root = getattr(self.transport, "base_url", None) or answer.get("http_root")
        path = str(answer["base_url_path"])
        return SessionHandle(
            session_id=answer["session_id"],
            api_key=answer["key"],
            base_url=f"{root}{path}" if isinstance(root, str) else None,
            base_url_path=path,
            model=answer["model"],
            job_id=int(answer["job_id"]),
            expires_at=answer.get("expires_at"),
        )

    def session_trajectory(self, session_id: str) -> dict[str, Any]:
        """A session's ``turns``, merged ``rows`` and ``batch`` (the rows as ``Batch`` fields:
        input_ids, loss_mask, rollout_log_probs: the sampler's) for ``fwd_bwd``."""
        return dict(self.transport.call("session_trajectory", {"session_id": session_id}))

    def list_sessions(self) -> list[dict[str, Any]]:
        """The open sessions on this client's sampling job."""
        answer = self.transport.call("list_sessions", {"job_id": self.job_ids.get("sampling")})
        return list(answer["sessions"])

    def close_session(self, session_id: str) -> dict[str, Any]:
        """Close a session (its trajectory goes with it)."""
        return dict(self.transport.call("close_session", {"session_id": session_id}))


__all__ = ["SessionHandle", "SessionMethods"]
