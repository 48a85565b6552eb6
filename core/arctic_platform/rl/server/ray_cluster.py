"""Starting or attaching to the Ray cluster the jobs run on (logical GPUs in CPU mode)."""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Environment every Ray process of ours gets: no usage reports, loopback only.
RAY_QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_AUTH_MODE": "token",  # drivers must say so too, or they send no token
}


def prepare_ray(token_path: Path | None = None) -> Any:
    """Set Ray's environment (loopback only, token auth with ``token_path``) and import it.

    Ray reads the loopback switch when it is first imported; if some library imported Ray
    earlier (vLLM does), the switch is set on the loaded module too.
    """
    os.environ.update(RAY_QUIET_ENV)
    if token_path is not None:
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # keep every address on 127.0.0.1
    try:  # Ray caches its auth mode in RayConfig; refresh it so token mode holds here too
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except ImportError:  # another Ray version: the environment variables above suffice
        pass
    return ray


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


@dataclass
class RayCluster:
    """The Ray cluster this server uses and whether this server started it."""

    address: str
    started_here: bool
    cpu_mode: bool
    resources: dict[str, float]
    inside_ray: bool = False

    def shutdown(self) -> None:
        """Disconnect; a cluster started here goes down with it, an attached one stays up."""
        import ray

        if ray.is_initialized() and not self.inside_ray:
            ray.shutdown()


def _attachable_address(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return env
    return None


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

    On a machine without CUDA the fresh cluster gets ``num_gpus`` *logical* GPUs so placement
    works the same; that is logged once. A cluster we did not start is never shut down.
    """
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    ray = prepare_ray(Path(token) if token else ensure_auth_token(run_dir / "ray_auth_token"))

    devices = cuda_device_count()
    cpu_mode = devices == 0
    if ray.is_initialized():  # e.g. the server hosted inside a Ray actor
        context = ray.get_runtime_context()
        return RayCluster(context.gcs_address, False, cpu_mode, ray.cluster_resources(), True)
    target = _attachable_address(address)
    if ray_auto_attach and target:
        try:
            ray.init(
                address=target,
                log_to_driver=False,
                namespace="arctic_rl",
                _node_ip_address="127.0.0.1",
            )
            resources = ray.cluster_resources()
            if resources.get("GPU", 0) > 0:
                logger.info("attached to the Ray cluster at %s (%s GPUs)", target, resources["GPU"])
                return RayCluster(target, False, cpu_mode, resources)
            logger.info("the Ray cluster at %s has no GPU resources; starting a fresh one", target)
            ray.shutdown()
        except Exception as exc:  # unreachable cluster: start our own
            logger.info(
                "cannot attach to the Ray cluster at %s (%s); starting a fresh one", target, exc
            )
            if ray.is_initialized():
                ray.shutdown()
    kwargs: dict[str, Any] = {}
    if cpu_mode:
        kwargs["num_gpus"] = max(num_gpus, 1)
        logger.warning(
            "no CUDA device: CPU mode, Ray gets %d logical GPU(s); engines run on the CPU",
            kwargs["num_gpus"],
        )
    temp_dir = Path(os.environ.get("ARCTIC_RL_RAY_TMP", "/tmp")) / f"arctic-rl-ray-{os.getpid()}"
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(
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
    return RayCluster(context.gcs_address, True, cpu_mode, resources)
