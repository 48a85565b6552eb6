"""The session's shared live server: ``arctic-rl serve`` (http) with three running jobs.

The local backend launches the server subprocess with its Ray cluster; training (DeepSpeed),
sampling (vLLM) and log-prob (vLLM) jobs run on the tiny model, one logical GPU each. It
starts on the first test that asks for it and stops after the last one (``support.lasting``),
so the hardening, whole-loop and server-sync modules pay for one server instead of three.
Tests leave it running with its three jobs; a test that kills a worker brings it back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from support.clients import arctic_home, client_config

if TYPE_CHECKING:
    import pytest

    from arctic_platform.rl.client import ArcticRLClient

FIXTURE = "live"
FIRST = "live_first"  # marker: run before the other tests of the shared server (fresh state)
LAST = "live_last"  # marker: run after them (the test ends the server)


@dataclass
class LiveServer:
    """A running server, the client that started it, and what a raw HTTP caller needs."""

    client: ArcticRLClient
    base_url: str
    token: str
    run_dir: Path
    home: Path
    pid: int

    @property
    def auth(self) -> dict[str, str]:
        """The header that authorises a request."""
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def job_ids(self) -> dict[str, int]:
        """Job id per job type (all three exist)."""
        return {k: int(v) for k, v in self.client.job_ids.items() if v is not None}

    def http(self, timeout: float = 120.0) -> httpx.Client:
        """A plain httpx client carrying the token."""
        return httpx.Client(base_url=self.base_url, headers=self.auth, timeout=timeout)

    def states(self) -> dict[int, str]:
        """State of every job the server knows, by id."""
        return {j["job_id"]: j["state"] for j in self.client.get_server_state()["jobs"]}

    def assert_healthy(self) -> None:
        """The server answers and each of the three jobs is still running."""
        with self.http(timeout=30) as http:
            assert http.get("/health").status_code == 200
        states = self.states()
        for job_type, job_id in self.job_ids.items():
            assert states[job_id] == "running", (job_type, states)

    def env(self) -> dict[str, str]:
        """The environment of a subprocess that reconnects to these jobs (it finds the run
        dir and token under this server's ``ARCTIC_RL_HOME``)."""
        return {**os.environ, "ARCTIC_RL_HOME": str(self.home)}

    def settle(self) -> None:
        """A known state for a module that starts here: a gradient an earlier test left
        pending is applied, and sampler and log-prob job get the trainer's weights."""
        self.assert_healthy()
        self.client.step()
        self.client.sync_weights()

    def stop(self) -> None:
        """Shut down the jobs, the server and its Ray cluster (a no-op once a test did)."""
        with arctic_home(self.home):
            self.client.shutdown()


def start(model: str, home: Path) -> LiveServer:
    """Launch the server and its three jobs under ``home`` (its ``ARCTIC_RL_HOME``)."""
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.testing import free_port

    port = free_port()
    # metrics exported every second (Ray's default: 10 s) for the Prometheus test, with a
    # nominal device peak so the MFU estimate exists on the CPU
    metrics = {"RAY_metrics_report_interval_ms": "1000", "ARCTIC_RL_PEAK_FLOPS": "1e12"}
    with arctic_home(home, **metrics):
        client = ArcticRLClient(client_config(model, port), progress=False)
    backend = client.backend
    run_dir = Path(backend.run_dir)  # type: ignore[attr-defined]
    return LiveServer(
        client=client,
        base_url=f"http://127.0.0.1:{port}",
        token=(run_dir / "token").read_text().strip(),
        run_dir=run_dir,
        home=home,
        pid=int(backend._server_pid()),  # type: ignore[attr-defined]
    )


def _uses(item: pytest.Item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


def order(items: list[pytest.Item]) -> None:
    """Put the ``live_first`` tests right before the other tests of the shared server (before
    the module of the first of them) and the ``live_last`` ones right after them (after the
    module of the last), so the server's life is short; every other test keeps its place."""
    first = [item for item in items if _uses(item) and item.get_closest_marker(FIRST)]
    last = [item for item in items if _uses(item) and item.get_closest_marker(LAST)]
    if not first and not last:
        return
    moved = {id(item) for item in first + last}
    rest = [item for item in items if id(item) not in moved]
    users = [i for i, item in enumerate(rest) if _uses(item)]
    if users:  # whole modules stay together: before the first user's, after the last one's
        begin = next(i for i, item in enumerate(rest) if item.path == rest[users[0]].path)
        end = 1 + max(i for i, item in enumerate(rest) if item.path == rest[users[-1]].path)
    else:  # only moved tests use it: they stay where the first of them was
        begin = end = next(i for i, item in enumerate(items) if id(item) in moved)
    items[:] = [*rest[:begin], *first, *rest[begin:end], *last, *rest[end:]]
