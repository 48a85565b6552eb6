"""The server side of the ``ray`` transport: ``RLServer`` in a named detached Ray actor.

``serve(run_dir, ...)`` runs in the ``arctic-rl serve --transport ray`` process: it starts
(or attaches to) the Ray cluster, creates the actor on this node, writes the cluster address
to ``run_dir/ray_address`` for clients, and returns once the actor was asked to shut down.
The actor also serves the agent sessions' OpenAI-compatible routes over HTTP on the serve
command's ``--host``/``--port`` (a free port when it is 0 or taken): agent frameworks speak
HTTP whatever transport the client uses, and the token rule holds there as for ``http``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import ArcticRLError, ServeError, SessionHTTPServer, write_private

logger = logging.getLogger(__name__)

ACTOR_NAME = "arctic-rl-server"
NAMESPACE = "arctic_rl"
ADDRESS_FILE = "ray_address"


class RLServerActor:
    """Hosts one ``RLServer``; ``handle`` is the whole operation surface."""

    def __init__(
        self, run_dir: str, options: dict[str, Any], sessions: dict[str, Any] | None = None
    ) -> None:
        from arctic_platform.rl.api import RLServer

        logging.basicConfig(level=logging.INFO)
        self.server = RLServer(run_dir, **options).start()
        self.sessions: SessionHTTPServer | None = None
        if sessions is not None:
            self.sessions = _serve_sessions(self.server, **sessions)
            self.server.agents.http_root = self.sessions.root

    def session_root(self) -> str | None:
        """Where the session routes are served (``http://host:port``), or None."""
        return None if self.sessions is None else self.sessions.root

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        """Run one operation; errors travel back to the caller as they are."""
        return self.server.handle(name, payload)

    def shutdown_requested(self) -> bool:
        """True once a client asked the server to shut down."""
        return self.server.shutdown_requested.is_set()

    def close(self) -> None:
        """Stop serving sessions and destroy every job."""
        if self.sessions is not None:
            self.sessions.close()
        self.server.close()


def _serve_sessions(server: Any, host: str, port: int, token: str | None) -> SessionHTTPServer:
    """The session routes on ``host:port``; on a free port when that one is taken."""
    sessions = SessionHTTPServer(server, host, token, port=port, stop=server.shutdown_requested)
    try:
        sessions.start()
    except ServeError as exc:
        if port == 0:
            raise
        logger.warning("%s; serving agent sessions on a free port instead", exc)
        sessions = SessionHTTPServer(server, host, token, stop=server.shutdown_requested)
        sessions.start()
    return sessions


def serve(
    run_dir: Path,
    *,
    num_gpus: int = 1,
    ray_auto_attach: bool = True,
    ray_address: str | None = None,
    op_timeout: float = 900.0,
    sync_timeout: float = 120.0,
    poll_interval: float = 0.5,
    resume: bool = False,
    settings: dict[str, Any] | None = None,
    token: str | None = None,
) -> None:
    """Host ``RLServer`` as the detached actor ``arctic-rl-server`` until it is shut down.

    With ``resume`` the server brings back the jobs of its job table in ``run_dir``. The
    session routes are served on ``settings``' host and port, with ``token`` (None: open,
    loopback only).
    """
    from arctic_platform.rl.api import start_or_attach

    (run_dir / ADDRESS_FILE).unlink(missing_ok=True)  # a crashed server's address is stale
    # start_or_attach sets Ray's environment (loopback only) before Ray is first imported
    cluster = start_or_attach(
        num_gpus=num_gpus, run_dir=run_dir, ray_auto_attach=ray_auto_attach, address=ray_address
    )
    import ray

    try:
        try:
            existing = ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
        except ValueError:
            existing = None
        if existing is not None:
            raise ArcticRLError(
                f"a Ray actor {ACTOR_NAME!r} already runs in namespace {NAMESPACE!r} on the "
                f"cluster at {cluster.address}"
            )
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        where = settings or {}
        sessions = {
            "host": str(where.get("host") or "127.0.0.1"),
            "port": int(where.get("port") or 0),
            "token": token,
        }
        actor = (
            ray.remote(RLServerActor)
            .options(
                name=ACTOR_NAME,
                namespace=NAMESPACE,
                lifetime="detached",
                num_cpus=0,
                max_concurrency=32,
                # on this node: the run dir is here, and so is the session routes' --host
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(
                str(run_dir),
                {
                    "num_gpus": num_gpus,
                    "op_timeout": op_timeout,
                    "sync_timeout": sync_timeout,
                    "monitor_interval": 5.0,
                    "resume": resume,
                    "settings": settings,
                },
                sessions,
            )
        )
        ray.get(actor.handle.remote("health", None))
        write_private(run_dir / ADDRESS_FILE, cluster.address)
        logger.info(
            "RLServer is the Ray actor %r (namespace %r) on %s; agent sessions at %s",
            ACTOR_NAME,
            NAMESPACE,
            cluster.address,
            ray.get(actor.session_root.remote()),
        )
        while True:
            time.sleep(poll_interval)
            try:
                if ray.get(actor.shutdown_requested.remote(), timeout=30):
                    break
            except Exception as exc:
                logger.warning("the server actor is gone: %s", exc)
                break
        try:
            ray.get(actor.close.remote(), timeout=120)
        except Exception:
            pass
        ray.kill(actor, no_restart=True)
    finally:
        (run_dir / ADDRESS_FILE).unlink(missing_ok=True)
        cluster.shutdown()
