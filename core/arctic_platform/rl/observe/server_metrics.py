"""What the server records: requests, jobs, weight syncs and agent sessions (``families``)."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from arctic_platform.rl.errors import ArcticRLError
from arctic_platform.rl.observe import recorder

JOB_TYPES = ("training", "sampling", "log_prob")
JOB_STATES = ("pending", "placing", "initializing", "running", "failed", "cancelled", "terminated")


def record_request(operation: str, job_type: str, status: int, code: str, seconds: float) -> None:
    """One answered request: its count by status, its latency, and its error if any."""
    recorder.inc("arctic_rl_requests_total", operation=operation, job_type=job_type, status=status)
    recorder.observe(
        "arctic_rl_request_duration_seconds", seconds, operation=operation, job_type=job_type
    )
    if status >= 400:
        recorder.inc(
            "arctic_rl_request_errors_total", operation=operation, status=status, code=code
        )


class RequestOutcome:
    """One request being answered: ``failed`` notes its error, ``done`` records it."""

    def __init__(self, meter: RequestMeter, operation: str, job_type: str) -> None:
        self.meter = meter
        self.operation = operation
        self.job_type = job_type
        self.status, self.code = 200, ""
        self.started = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        """The request raised ``exc``: its HTTP status and code (500 for a non-Arctic error)."""
        if isinstance(exc, ArcticRLError):
            self.status, self.code = exc.status, exc.code
        else:
            self.status, self.code = 500, "internal_error"

    def done(self) -> None:
        """The request was answered: its count, latency and error; one fewer in flight."""
        seconds = time.monotonic() - self.started
        self.meter.finished(self.operation, self.status >= 400, seconds)
        record_request(self.operation, self.job_type, self.status, self.code, seconds)


class RequestMeter:
    """The server's requests per operation: in flight now, and since the start their count,
    failures and seconds (the JSON ``metrics`` operation's figures; the same request timed
    once for it and for Prometheus)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flying: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def start(self, operation: str, job_type: str) -> RequestOutcome:
        """A request arrived: one more in flight; answer with the returned outcome."""
        with self._lock:
            self.counts[operation] += 1
        self.flying(operation, +1)
        return RequestOutcome(self, operation, job_type)

    def finished(self, operation: str, failed: bool, seconds: float) -> None:
        """A request of ``operation`` was answered after ``seconds``: one fewer in flight."""
        with self._lock:
            self.seconds[operation] += seconds
            if failed:
                self.errors[operation] += 1
        self.flying(operation, -1)

    def flying(self, operation: str, change: int) -> None:
        """Change the in-flight count of ``operation`` and export it."""
        with self._lock:
            self._flying[operation] += change
            now = self._flying[operation]
        recorder.set_gauge("arctic_rl_requests_in_flight", now, operation=operation)

    def totals(self) -> dict[str, dict[str, Any]]:
        """Requests, errors and seconds per operation since the server started."""
        with self._lock:
            return {
                "requests": dict(self.counts),
                "errors": dict(self.errors),
                "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
            }


def record_jobs(jobs: Iterable[Any]) -> None:
    """Jobs by type and state: every (type, state) pair set, 0 where none is."""
    counts = Counter((job.job_type, str(job.state.value)) for job in jobs)
    for job_type in JOB_TYPES:
        for state in JOB_STATES:
            recorder.set_gauge(
                "arctic_rl_jobs", counts.get((job_type, state), 0), job_type=job_type, state=state
            )


def record_start(job_type: str, reason: str) -> None:
    """A job started: ``create`` (initialize) or ``restart`` (restart_job)."""
    recorder.inc("arctic_rl_job_starts_total", job_type=job_type, reason=reason)


def record_sync(result: dict[str, Any], target_types: Iterable[str]) -> None:
    """One weight sync: its kind, bytes, seconds, and the version the targets now hold."""
    kind = "adapter" if result.get("adapter") else "full"
    recorder.inc("arctic_rl_weight_sync_total", kind=kind)
    recorder.inc("arctic_rl_weight_sync_bytes_total", float(result.get("bytes") or 0), kind=kind)
    if result.get("seconds") is not None:
        recorder.observe(
            "arctic_rl_weight_sync_duration_seconds", float(result["seconds"]), kind=kind
        )
    version = result.get("weight_version")
    if version is not None:
        for job_type in {"training", *target_types}:
            recorder.set_gauge("arctic_rl_weight_version", float(version), job_type=job_type)


def record_sessions_open(count: int) -> None:
    """How many agent sessions are open now."""
    recorder.set_gauge("arctic_rl_agent_sessions_open", count)


def record_turn(new_segment: bool, prefix_break: bool) -> None:
    """One agent turn answered: whether it started a segment, and whether its history broke
    the earlier turn's tokens."""
    recorder.inc("arctic_rl_agent_turns_total", segment="new" if new_segment else "extend")
    if prefix_break:
        recorder.inc("arctic_rl_agent_prefix_breaks_total")


def record_http_bytes(api: str, received: int, sent: int) -> None:
    """Bytes of one HTTP request body and its response body."""
    recorder.inc("arctic_rl_http_bytes_total", received, direction="in", api=api)
    recorder.inc("arctic_rl_http_bytes_total", sent, direction="out", api=api)
