"""``EngineWorker``: the Ray actor that hosts one engine instance (one rank or replica of a job).

The actor resolves its engine by name from the plugin registry in its own process; it never
receives plugin objects. Only the methods listed for its role can be called on the engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from arctic_platform.rl.interfaces import EngineContext

ADAPTER_METHODS = ("adapters", "remove_adapter")
"""What a LoRA engine lists and drops (a training engine also adds them; a sampling or log-prob
engine loads them by weight sync)."""

ALLOWED_METHODS: dict[str, frozenset[str]] = {
    "training": frozenset(
        {
            "fwd_bwd",
            "fwd_no_grad",
            "step",
            "save_checkpoint",
            "load_checkpoint",
            "weight_norm",
            "sleep",
            "wake",
            "empty_cache",
            "lora_info",
            "add_adapter",
            *ADAPTER_METHODS,
        }
    ),
    "sampling": frozenset(
        {"generate", "reset_prefix_cache", "weight_norm", "sleep", "wake", *ADAPTER_METHODS}
    ),
    "log_prob": frozenset(
        {
            "log_probs",
            "fwd_no_grad",
            "weight_norm",
            "sleep",
            "wake",
            "reset_prefix_cache",
            *ADAPTER_METHODS,
        }
    ),
}


class EngineWorker:
    """One engine in one Ray actor process; the server drives it through ``call``."""

    def __init__(
        self,
        role: str,
        engine_name: str,
        config: dict[str, Any],
        rank: int,
        world_size: int,
        replica: int,
        work_dir: str,
        env: dict[str, str],
    ) -> None:
        os.environ.update(env)
        self.context = EngineContext(role, rank, world_size, replica, work_dir)
        self.engine_name = engine_name
        self.config_data = config
        self.engine: Any = None
        self._lock = threading.Lock()
        self._observe_failed: set[str] = set()  # methods whose metrics failed once (logged)

    def node(self) -> dict[str, Any]:
        """Where this worker runs: its node's address and Ray node id, and its pid."""
        import ray

        return {
            "address": self.node_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    @staticmethod
    def node_address() -> str:
        """This node's address in the cluster (127.0.0.1 in a loopback-only cluster)."""
        import ray

        return str(ray.util.get_node_ip_address())

    def free_port(self) -> int:
        """A port free on this node's address, for a listener this worker will bind."""
        from arctic_platform.rl.network import free_port

        return free_port(self.node_address())

    def free_port_range(self, count: int) -> int:
        """A base port with ``count`` consecutive ports free on this node's address."""
        from arctic_platform.rl.network import free_port_range

        return free_port_range(count, self.node_address())

    def ports_free(self, base: int, count: int) -> bool:
        """Whether ``base .. base+count-1`` are free on this node's address right now."""
        from arctic_platform.rl.network import ports_free

        return ports_free(self.node_address(), base, count)

    def setup(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Build the engine (model load, distributed init) with ``env`` added; returns where it
        runs.

        Gloo and NCCL use the interface holding this node's address unless the environment
        already names one (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``)."""
        from arctic_platform.rl.config import ArcticRLClientConfig
        from arctic_platform.rl.network import interface_with_address
        from arctic_platform.rl.plugins import get_registry

        os.environ.update(env or {})
        interface = interface_with_address(self.node_address())
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if interface and not os.environ.get(name):
                os.environ[name] = interface
        with self._lock:
            config = ArcticRLClientConfig.model_validate(self.config_data)
            spec = get_registry().get("engine", self.engine_name, role=self.context.role)
            started = time.monotonic()
            self.engine = spec.create(config, self.context)
            return {
                "pid": os.getpid(),
                "seconds": time.monotonic() - started,
                "address": self.node_address(),
            }

    def batch_limits(self) -> Any:
        """The ``BatchLimits`` the engine accepts batches within, or None (no ``batch_limits``)."""
        report = getattr(self.engine, "batch_limits", None)
        return report() if report is not None else None

    def ping(self) -> int:
        """Liveness check that never waits for the engine lock."""
        return os.getpid()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``engine.<method>(*args, **kwargs)`` if the role allows it.

        Methods the engine lists in ``concurrent_methods`` (it serialises them itself, e.g.
        the vLLM sampling engine's request loop, which batches concurrent generates) run
        without the worker's lock; every other method runs alone.
        """
        if method not in ALLOWED_METHODS.get(self.context.role, frozenset()):
            raise ValueError(f"{method!r} is not an operation of a {self.context.role} engine")
        started = time.monotonic()
        engine = self.engine
        if engine is not None and method in getattr(engine, "concurrent_methods", ()):
            result = getattr(engine, method)(*args, **kwargs)
        else:
            with self._lock:
                if self.engine is None:
                    raise RuntimeError("engine is not set up")
                result = getattr(self.engine, method)(*args, **kwargs)
        self._observe(method, time.monotonic() - started, args, result)
        return result

    def _observe(self, method: str, seconds: float, args: tuple[Any, ...], result: Any) -> None:
        """Record the call's metrics (``observe.engine_metrics``); never raises: a failure is
        a bug of the recording code, logged with its traceback the first time per method."""
        from arctic_platform.rl.observe.engine_metrics import record_call

        try:
            record_call(
                self.context.role,
                method,
                seconds,
                args,
                result,
                counts_tokens=self.context.rank == 0,
                parameters=getattr(self.engine, "parameter_count", None),
            )
        except Exception:  # metrics never break the call they observe
            if method not in self._observe_failed:
                self._observe_failed.add(method)
                logging.getLogger(__name__).exception(
                    "metrics of %s's %s call failed (the call itself succeeded)",
                    self.context.role,
                    method,
                )

    def global_step(self) -> int:
        """The training engine's optimizer step count."""
        with self._lock:
            return int(self.engine.global_step)

    def sync_send(
        self,
        sync_config: dict[str, Any],
        version: int,
        timeout: float,
        shared_memory: bool,
        secret: str | None = None,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        """Send this rank's weights (LoRA: named ``adapter``'s, default the live one) to its
        targets (every rank joins the gather).

        Pair stores listen on this node's address; receivers must prove ``secret``."""
        from arctic_platform.rl.config import WeightSyncConfig
        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator

        channels, buffers = self._sync_caches()
        coordinator = WeightSyncCoordinator(
            WeightSyncConfig(**sync_config),
            timeout=timeout,
            host=self.node_address(),
            shared_memory=shared_memory,
            channels=channels,
            buffers=buffers,
            secret=secret,
        )
        with self._lock:
            named = {} if adapter is None else {"adapter": adapter}
            weights = self.engine.named_weights(**named)
            report = coordinator.send(self.context.rank, weights, version=version)
        return report.as_dict()

    def sync_receive(
        self,
        sync_config: dict[str, Any],
        replica: int,
        version: int,
        timeout: float,
        shared_memory: bool,
        strategy: str = "drain",
        sender_addresses: dict[int, str] | None = None,
        secret: str | None = None,
        adapter: str | None = None,
        lora: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Receive all weights (from the sender ranks at ``sender_addresses``), then swap them
        in by ``strategy``.

        An engine with ``swap_weights`` (the vLLM sampling engine) swaps between two of its
        steps: ``drain`` after the running requests finish, ``hotswap`` with them running.
        Any other engine swaps under the worker's lock, between two calls (no call of those
        engines spans a swap, so both strategies mean the same there). With ``adapter`` (a
        LoRA sync; ``lora`` = the trainer's rank and target modules) only adapter tensors
        arrive, and the engine's ``load_adapter`` loads them as ``adapter`` at ``version``.
        """
        from arctic_platform.rl.config import WeightSyncConfig
        from arctic_platform.rl.weight_sync.coordinator import WeightSyncCoordinator
        from arctic_platform.rl.weight_sync.strategy import check_strategy

        check_strategy(strategy)
        channels, buffers = self._sync_caches()
        coordinator = WeightSyncCoordinator(
            WeightSyncConfig(**sync_config),
            timeout=timeout,
            host=self.node_address(),
            sender_hosts={int(k): v for k, v in (sender_addresses or {}).items()},
            shared_memory=shared_memory,
            channels=channels,
            buffers=buffers,
            secret=secret,
        )
        # full checkpoint tensors: vLLM's weight loaders cut their own tensor-parallel shards;
        # they are views into kept buffers, valid until the next sync (load_weights copies)
        expected = self._expected_weights(lora)
        received, report = coordinator.receive(replica, 0, expected=expected)
        swap = getattr(self.engine, "swap_weights", None)
        if adapter is not None:
            swapped = self._engine_call("load_adapter", adapter, version, received)
        elif swap is not None:
            swapped = swap(received, strategy=strategy, version=version)
        else:
            with self._lock:  # waits for the call in flight, then swaps
                self.engine.load_weights(received)
            swapped = {"strategy": strategy, "weight_version": version}
        tensor_bytes = sum(t.numel() * t.element_size() for _, t in received)
        del received
        return {**report.as_dict(), "tensor_bytes": tensor_bytes, "swap": swapped}

    def _sync_caches(self) -> tuple[Any, Any]:
        """The pair worlds and buffers this worker keeps between weight syncs."""
        from arctic_platform.rl.weight_sync.buffers import BufferCache
        from arctic_platform.rl.weight_sync.channels import ChannelCache

        if not hasattr(self, "_sync_channels"):
            self._sync_channels = ChannelCache()
            self._sync_buffers = BufferCache()
        return self._sync_channels, self._sync_buffers

    def accepts_adapters(self) -> bool:
        """Whether the engine loads LoRA adapters (has ``load_adapter``): a LoRA sync's check."""
        return callable(getattr(self.engine, "load_adapter", None))

    def _engine_call(self, method: str, *args: Any) -> Any:
        """``engine.<method>(*args)``: alone under the worker's lock, unless the engine
        serialises that method itself (``concurrent_methods``)."""
        if method in getattr(self.engine, "concurrent_methods", ()):
            return getattr(self.engine, method)(*args)
        with self._lock:
            return getattr(self.engine, method)(*args)

    def _expected_weights(self, lora: dict[str, Any] | None = None) -> Any:
        """Names and shapes the receiver checks a plan against: the model's checkpoint, or
        with ``lora`` (rank, target_modules) the adapter tensors of its targeted layers."""
        from pathlib import Path

        from arctic_platform.rl.weight_sync.adapters import expected_adapter
        from arctic_platform.rl.weight_sync.buckets import expected_from_checkpoint

        model = Path(str(self.config_data.get("model_name", "")))
        if not hasattr(self, "_expected"):
            self._expected = expected_from_checkpoint(model) if model.is_dir() else None
        if lora is None or self._expected is None:
            return self._expected
        return expected_adapter(
            self._expected, int(lora["rank"]), lora["target_modules"], model_dir=model
        )

    def close(self) -> None:
        """Free the engine before the actor is killed."""
        with self._lock:
            if self.engine is not None:
                try:
                    self.engine.close()
                finally:
                    self.engine = None
