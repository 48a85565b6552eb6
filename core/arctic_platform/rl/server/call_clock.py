"""``CallClock``: when a call reached the server, when its job took it up and when its engines
answered; the ``queue_seconds`` and ``compute_seconds`` (and token counts) that every training
and sampling result carries, so a loop can log them without timing its calls itself."""

from __future__ import annotations

import time


class CallClock:
    """The times of one call; ``start`` when the job takes it up (after its lock)."""

    def __init__(self) -> None:
        self.arrived = time.monotonic()
        self.started = self.arrived

    def start(self) -> None:
        """The job took the call up: the queue wait ends here."""
        self.started = time.monotonic()

    def figures(self, **counts: int) -> dict[str, float]:
        """``queue_seconds`` (waiting for the job), ``compute_seconds`` (the engines' part,
        Ray's round trips included) and ``counts`` (tokens)."""
        now = time.monotonic()
        return {
            "queue_seconds": self.started - self.arrived,
            "compute_seconds": now - self.started,
            **counts,
        }


__all__ = ["CallClock"]
