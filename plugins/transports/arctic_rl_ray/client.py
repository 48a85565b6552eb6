"""``RayTransport``: the client side of the ``ray`` transport; calls the server actor directly.

The client becomes a Ray driver on the server's cluster; payloads travel through Ray's
object store (no HTTP). Server errors come back as ``ServerError`` with the same status
codes the http transport uses, so callers see one behaviour.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import ArcticRLError, ClientTransport, ServerError, TransportError
from arctic_rl_ray.server import ACTOR_NAME, ADDRESS_FILE, NAMESPACE


def _listening(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class RayTransport(ClientTransport):
    """Calls ``RLServer.handle`` on the detached actor ``arctic-rl-server``."""

    def __init__(self, run_dir: str | Path, *, timeout: float = 960.0) -> None:
        self.run_dir = Path(run_dir)
        self.timeout = timeout
        self._actor: Any = None

    def _address(self) -> str | None:
        path = self.run_dir / ADDRESS_FILE
        return path.read_text().strip() if path.exists() else None

    def _connect(self) -> Any:
        if self._actor is not None:
            return self._actor
        address = self._address()
        if address is None:
            raise TransportError(f"no Ray server address in {self.run_dir / ADDRESS_FILE}")
        if not _listening(address):  # ray.init would wait minutes on a dead cluster's address
            raise TransportError(
                f"no Ray cluster answers at {address} (from {self.run_dir / ADDRESS_FILE}); "
                "the server is down or still starting"
            )
        from arctic_platform.rl.api import (
            driver_node_address,
            is_loopback_address,
            prepare_ray,
        )

        token = self.run_dir / "ray_auth_token"
        loopback = is_loopback_address(address)  # else join with this node's own address
        ray = prepare_ray(token if token.exists() else None, loopback=loopback)

        if not ray.is_initialized():
            try:
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    _node_ip_address=driver_node_address(address),
                )
            except Exception as exc:
                raise TransportError(f"cannot join the Ray cluster at {address}: {exc}") from None
        try:
            self._actor = ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
        except ValueError:
            raise TransportError(
                f"no actor {ACTOR_NAME!r} in namespace {NAMESPACE!r} on {address}"
            ) from None
        return self._actor

    def health(self) -> bool:
        """True when the server actor answers ``health``."""
        try:
            self.call("health", timeout=10)
            return True
        except Exception:
            return False

    def call(
        self, operation: str, payload: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Run ``operation`` on the server actor and return its result."""
        actor = self._connect()  # sets Ray's environment, then imports it
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(
                actor.handle.remote(operation, payload),
                timeout=self.timeout if timeout is None else timeout,
            )
        except RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, ArcticRLError):
                raise ServerError(cause.status, str(cause), cause.code) from None
            raise ServerError(500, f"{type(cause).__name__}: {cause}") from None
        except GetTimeoutError:
            raise TransportError(f"{operation} on the Ray server timed out") from None
        except RayActorError as exc:
            self._actor = None
            raise TransportError(f"the Ray server actor is gone: {exc}") from None

    def close(self) -> None:
        """Leave the cluster (the server and its jobs keep running)."""
        import ray

        self._actor = None
        if ray.is_initialized():
            ray.shutdown()
