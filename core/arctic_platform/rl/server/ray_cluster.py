"""Starting or attaching to the Ray cluster the jobs run on (logical GPUs in CPU mode)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Environment every Ray process of ours gets: no usage reports, token auth.
RAY_QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_AUTH_MODE": "token",  # drivers must say so too, or they send no token
}
# Only for a cluster we start ourselves: every Ray address stays on 127.0.0.1.
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
ATTACH_PROBE_TIMEOUT_S = 5.0


def prepare_ray(token_path: Path | None = None, *, loopback: bool = True) -> Any:
    """Set Ray's environment (token auth with ``token_path``; loopback only unless told) and
    import it.

    Ray reads the loopback switch when it is first imported; if some library imported Ray
    earlier (vLLM does), the switch is set on the loaded module too. ``loopback=False`` is
    for joining a cluster across nodes, where this process announces its own node address.
    """
    os.environ.update(RAY_QUIET_ENV)
    if loopback:
        os.environ[LOOPBACK_SWITCH] = "0"
    else:
        os.environ.pop(LOOPBACK_SWITCH, None)
    if token_path is not None:
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = not loopback  # loopback: every address on 127.0.0.1
    try:  # Ray caches its auth mode in RayConfig; refresh it so token mode holds here too
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except ImportError:  # another Ray version: the environment variables above suffice
        pass
    return ray


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` of a Ray bootstrap address (``ray://`` and IPv6 brackets allowed)."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is host:port, got {address!r}")
    return host.strip("[]"), int(port)


def driver_node_address(address: str) -> str:
    """The address this process announces when it joins the cluster at ``address``: its own
    address on the route to the head (127.0.0.1 for a cluster on loopback)."""
    from arctic_platform.rl.network import source_address_for

    return source_address_for(split_address(address)[0])


def unreachable_reason(address: str, timeout: float = ATTACH_PROBE_TIMEOUT_S) -> str | None:
    """Why nothing accepts connections at Ray ``address`` (None: something listens there).

    One TCP connect with a timeout: ``ray.init`` itself retries for about a minute."""
    import socket

    try:
        host, port = split_address(address)
    except ValueError as exc:
        return str(exc)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def cuda_device_count() -> int:
    """Number of CUDA devices visible to this process (0 on a CPU-only machine)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as none
        return 0


def ensure_auth_token(path: Path) -> Path:
    """Create Ray's cluster auth token file (mode 0600) if it is missing; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or not path.read_text().strip():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


TASK_EVENTS_KEPT = 10_000
"""Task events, and ids of evicted ones, the GCS of a Ray cluster this server starts keeps
(Ray's defaults: 100 000 and 1 000 000 per job). Measured with 40 000 cheap actor calls:
the GCS grows to ~87 MB by 16 000 calls and then stays flat; with Ray's defaults it is still
growing by ~500 B a call at 24 000."""
TASK_EVENT_BOUNDS = (
    "RAY_task_events_max_num_task_in_gcs",
    "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs",
)


@dataclass
class RayCluster:
    """The Ray cluster this server uses, whether this server started it, and its network mode.

    ``mode`` is ``loopback`` for a cluster started here (every address on 127.0.0.1) and
    ``cluster`` for one attached to (every process uses its own node's address).
    """

    address: str
    started_here: bool
    cpu_mode: bool
    resources: dict[str, float]
    inside_ray: bool = False
    mode: str = "loopback"
    node_address: str = "127.0.0.1"
    attach_refused: str | None = None
    temp_dir: Path | None = None

    def shutdown(self) -> None:
        """Disconnect; a cluster started here goes down with it, an attached one stays up.
        The temp dir of a cluster started here (its sessions' logs and sockets) is removed:
        a clean stop leaves nothing in /tmp (after a crash it stays, for a post-mortem).
        A process of a cluster started here that outlives the stop is killed by PID."""
        import ray

        from arctic_platform.rl.server.leftovers import end_leftovers, ray_processes

        ours = ray_processes(os.getpid()) if self.started_here and not self.inside_ray else []
        if ray.is_initialized() and not self.inside_ray:
            ray.shutdown()
        if ours:
            end_leftovers(ours)
        if self.started_here and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        """Where the jobs run: the cluster, its mode and its nodes (for ``status``)."""
        return {
            "mode": self.mode,
            "address": self.address,
            "attached": not self.started_here,
            "started_here": self.started_here,
            "cpu_mode": self.cpu_mode,
            "gpus": self.resources.get("GPU", 0),
            "server_node": self.node_address,
            "attach_refused": self.attach_refused,
            "nodes": cluster_nodes(),
        }


def cluster_nodes() -> list[dict[str, Any]]:
    """Every node Ray knows (alive or dead): id, address, GPUs, and why it died."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    out = []
    for node in ray.nodes():
        entry = {
            "node_id": node.get("NodeID"),
            "address": node.get("NodeManagerAddress"),
            "alive": bool(node.get("Alive")),
            "gpus": float((node.get("Resources") or {}).get("GPU", 0.0)),
        }
        if not entry["alive"]:
            entry["death_reason"] = node.get("DeathReasonMessage") or node.get("DeathReason")
        out.append(entry)
    return out


def _attachable_address(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    env = os.environ.get("RAY_ADDRESS")
    if env and env not in ("auto", "local"):
        return env
    return None


def _attach(ray: Any, target: str) -> tuple[dict[str, float] | None, str]:
    """Join the cluster at ``target``; returns its resources when it has GPUs, else why not.

    Leaves Ray connected only when the cluster was taken."""
    reason = unreachable_reason(target)
    if reason is not None:
        return None, f"cannot reach it ({reason})"
    try:
        node = driver_node_address(target)
        ray.init(address=target, log_to_driver=False, namespace="arctic_rl", _node_ip_address=node)
    except Exception as exc:
        if ray.is_initialized():
            ray.shutdown()
        text = str(exc).strip().splitlines()
        return None, f"cannot join it ({type(exc).__name__}: {text[0] if text else ''})"
    resources = dict(ray.cluster_resources())
    if resources.get("GPU", 0) > 0:
        return resources, ""
    ray.shutdown()
    return None, "it has no GPU resources (start its nodes with `ray start --num-gpus N`)"


# Ray waits a fixed 30 s for a new node's raylet to register with the GCS; on a loaded 2-core
# machine that ran out in full test runs ("The current node timed out during startup"). A
# cluster we start is then started again, after its half-started processes end.
RAY_START_ATTEMPTS = 3
RAY_START_TIMEOUT_TEXT = "timed out during startup"


def init_fresh_cluster(ray: Any, attempts: int = RAY_START_ATTEMPTS, **kwargs: Any) -> None:
    """``ray.init(**kwargs)`` for a cluster this process starts, tried ``attempts`` times when
    Ray's node start-up times out; the Ray processes a failed try started (and only those)
    are killed first."""
    from arctic_platform.rl.server.leftovers import end_leftovers, ray_processes

    for attempt in range(1, attempts + 1):
        before = set(ray_processes(os.getpid()))
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:
            if RAY_START_TIMEOUT_TEXT not in str(exc) or attempt == attempts:
                raise
            logger.warning(
                "starting the Ray cluster failed (try %d of %d: %s); starting it again",
                attempt,
                attempts,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
        if ray.is_initialized():
            ray.shutdown()
        end_leftovers([p for p in ray_processes(os.getpid()) if p not in before], grace=0.0)


def start_or_attach(
    *,
    num_gpus: int,
    run_dir: Path,
    ray_auto_attach: bool = True,
    address: str | None = None,
    num_cpus: int | None = None,
    object_store_bytes: int = 1_000_000_000,
) -> RayCluster:
    """Attach to the cluster at ``address``/RAY_ADDRESS when it has GPUs, else start a fresh one.

    An explicit ``address`` (``serve --ray-address``) is always tried; RAY_ADDRESS only with
    ``ray_auto_attach``. An attached cluster is used across its nodes; a fresh one stays on
    loopback. On a machine without CUDA the fresh cluster gets ``num_gpus`` *logical* GPUs so
    placement works the same; that is logged once. A cluster we did not start is never shut
    down.
    """
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    target = _attachable_address(address) if (ray_auto_attach or address) else None
    devices = cuda_device_count()
    cpu_mode = devices == 0
    import sys

    loaded = sys.modules.get("ray")
    if loaded is not None and loaded.is_initialized():  # e.g. the server inside a Ray actor
        context = loaded.get_runtime_context()
        gcs = context.gcs_address
        mode = "loopback" if is_loopback_address(gcs) else "cluster"
        own = "127.0.0.1" if mode == "loopback" else loaded.util.get_node_ip_address()
        return RayCluster(
            gcs, False, cpu_mode, loaded.cluster_resources(), True, mode=mode, node_address=own
        )
    refused: str | None = None
    if target:
        ray = prepare_ray(Path(token) if token else None, loopback=False)
        resources, why = _attach(ray, target)
        if resources is not None:
            node = driver_node_address(target)
            logger.info(
                "attached to the Ray cluster at %s (%g GPUs) as node %s; jobs run on its nodes",
                target,
                resources["GPU"],
                node,
            )
            mode = "loopback" if is_loopback_address(target) else "cluster"
            return RayCluster(target, False, cpu_mode, resources, mode=mode, node_address=node)
        refused = f"{target}: {why}"
        logger.warning(
            "not attaching to the Ray cluster at %s: %s; starting a fresh local Ray cluster "
            "on this machine instead (the jobs will not use that cluster)",
            target,
            why,
        )
    ray = prepare_ray(Path(token) if token else ensure_auth_token(run_dir / "ray_auth_token"))
    kwargs: dict[str, Any] = {}
    if cpu_mode:
        kwargs["num_gpus"] = max(num_gpus, 1)
        logger.warning(
            "no CUDA device: CPU mode, Ray gets %d logical GPU(s); engines run on the CPU",
            kwargs["num_gpus"],
        )
    temp_dir = Path(os.environ.get("ARCTIC_RL_RAY_TMP", "/tmp")) / f"arctic-rl-ray-{os.getpid()}"
    os.environ.pop("RAY_ADDRESS", None)
    # Ray's GCS keeps the events of the last 100 000 tasks by default (~2 KB each; about ten
    # actor calls a training step: gcs_server +23 KB/step, linear, for ~10 000 steps), then
    # the ids of up to 1 000 000 evicted ones per job (~130 B a call). A cluster we start
    # keeps TASK_EVENTS_KEPT of each; the server's environment overrides either.
    for name in TASK_EVENT_BOUNDS:
        os.environ.setdefault(name, str(TASK_EVENTS_KEPT))
    init_fresh_cluster(
        ray,
        address="local",
        num_cpus=num_cpus if num_cpus is not None else max(8, 2 * (num_gpus + 1)),
        include_dashboard=False,
        object_store_memory=object_store_bytes,
        _temp_dir=str(temp_dir),
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        namespace="arctic_rl",
        **kwargs,
    )
    context = ray.get_runtime_context()
    resources = ray.cluster_resources()
    return RayCluster(
        context.gcs_address,
        True,
        cpu_mode,
        resources,
        attach_refused=refused,
        temp_dir=temp_dir,
    )


def is_loopback_address(address: str) -> bool:
    """True when a Ray ``host:port`` address is on this machine's loopback."""
    from arctic_platform.rl.network import is_loopback

    try:
        return is_loopback(split_address(address)[0])
    except ValueError:
        return False
