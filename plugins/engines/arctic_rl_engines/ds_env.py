"""Process set-up for the DeepSpeed engines: distributed env, threads, extension cache, device.

DeepSpeed needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK even for one
process (otherwise it tries MPI); the engines' caller sets them for a real world, and
``ensure_distributed_env`` fills them in for a world of one on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import EngineConfigError, EngineContext, free_port

logger = logging.getLogger(__name__)

THREADS_ENV = "ARCTIC_RL_NUM_THREADS"
DEFAULT_EXTENSIONS_DIR = Path("~/.cache/arctic_rl/torch_extensions")
DIST_TIMEOUT_S = 600.0


def ensure_distributed_env(context: EngineContext | None = None) -> dict[str, str]:
    """Fill in the distributed variables for a one-process world; returns those it set.

    A world of several processes must come with all of them set by the caller (a random
    port cannot be agreed on); ``context.rank``/``world_size`` must agree with them.
    """
    world_env = os.environ.get("WORLD_SIZE")
    world = int(world_env) if world_env else (context.world_size if context else 1)
    if world > 1:
        missing = [
            k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)
        ]
        if missing:
            raise EngineConfigError(
                f"a DeepSpeed world of {world} processes needs {missing} set by the caller "
                "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)"
            )
    defaults = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    set_now: dict[str, str] = {}
    for key, value in defaults.items():
        if not os.environ.get(key):
            os.environ[key] = set_now[key] = value
    if not os.environ.get("MASTER_PORT"):
        os.environ["MASTER_PORT"] = set_now["MASTER_PORT"] = str(free_port("127.0.0.1"))
    if context is not None:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if (context.rank, context.world_size) != (rank, world):
            raise EngineConfigError(
                f"engine context says rank {context.rank} of {context.world_size} but the "
                f"environment says RANK={rank} WORLD_SIZE={world}"
            )
    return set_now


def configure_process() -> int:
    """Point TORCH_EXTENSIONS_DIR at our cache (if unset) and set torch's thread count.

    Threads come from ``ARCTIC_RL_NUM_THREADS`` (default 1): CPU ranks that share cores
    slow down many times over with torch's default of one thread per core each.
    """
    import torch

    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        path = DEFAULT_EXTENSIONS_DIR.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        threads = int(raw)
    except ValueError:
        raise EngineConfigError(f"{THREADS_ENV}={raw!r} is not an integer") from None
    if threads < 1:
        raise EngineConfigError(f"{THREADS_ENV}={threads} must be >= 1")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


_LISTENERS: list[int] = []  # listening fds handed to rendezvous stores: open for life


def bound_store(timeout: Any) -> Any:
    """The world's rendezvous TCPStore, listening on MASTER_ADDR only (rank 0's node address).

    torch's own store listens on every interface whatever MASTER_ADDR says; rank 0 binds the
    socket itself and hands it over, so the world is reachable only where it was announced
    (127.0.0.1 in a loopback cluster, the node's cluster address across nodes).
    """
    from torch.distributed import TCPStore

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank != 0:
        return TCPStore(host, port, world, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(max(128, world))
    except OSError:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the listening socket from here on
    _LISTENERS.append(fd)
    return TCPStore(host, port, world, True, timeout=timeout, master_listen_fd=fd)


def init_distributed() -> tuple[int, int]:
    """Initialise DeepSpeed's process group once (gloo on CPU); returns (rank, world size)."""
    from datetime import timedelta

    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    if not dist.is_initialized():
        backend = get_accelerator().communication_backend_name()
        if on_cpu():
            backend = "gloo"
        timeout = timedelta(seconds=DIST_TIMEOUT_S)
        dist.init_process_group(
            backend=backend,
            store=bound_store(timeout),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    elif not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(auto_mpi_discovery=False)
    return dist.get_rank(), dist.get_world_size()


def on_cpu() -> bool:
    """True when DeepSpeed runs on its CPU accelerator."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"


def device() -> Any:
    """The torch device of this rank (``cpu``, or the local accelerator device)."""
    import torch
    from deepspeed.accelerator import get_accelerator

    if on_cpu():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    get_accelerator().set_device(local_rank)
    return torch.device(get_accelerator().device_name(local_rank))


def import_deepspeed() -> Any:
    """``import deepspeed``, without the ``import mlflow`` of DeepSpeed's autotuner.

    Where mlflow is installed (our trackers extra), that import is about 40 % of DeepSpeed's
    own (1.8 of 4.4 s here, pandas included), in every engine process; the engines never
    autotune. mlflow stays importable afterwards for anything else in the process.
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # its import raises ImportError
    try:
        import deepspeed
    finally:
        if hide and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed


def setup(context: EngineContext | None = None) -> tuple[int, int]:
    """Everything an engine needs before building its model; returns (rank, world size)."""
    import_deepspeed()
    ensure_distributed_env(context)
    configure_process()
    return init_distributed()
