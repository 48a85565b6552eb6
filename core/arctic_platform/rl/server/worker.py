"""``EngineWorker``: the Ray actor that hosts one engine instance (one rank or replica of a job).

The actor resolves its engine by name from the plugin registry in its own process; it never
receives plugin objects. Only the methods listed for its role can be called on the engine.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

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
        }
    ),
    "sampling": frozenset({"generate", "reset_prefix_cache", "weight_norm", "sleep", "wake"}),
    "log_prob": frozenset(
        {"log_probs", "fwd_no_grad", "weight_norm", "sleep", "wake", "reset_prefix_cache"}
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
        self.role = role
        self.engine_name = engine_name
        self.config_data = config
        self.rank = rank
        self.world_size = world_size
        self.replica = replica
        self.work_dir = work_dir
        self.engine: Any = None
        self._lock = threading.Lock()

    def setup(self) -> dict[str, Any]:
        """Build the engine (model load, distributed init); returns where it runs."""
        from arctic_platform.rl.config import ArcticRLClientConfig
        from arctic_platform.rl.interfaces import EngineContext
        from arctic_platform.rl.plugins import get_registry

        with self._lock:
            config = ArcticRLClientConfig.model_validate(self.config_data)
            spec = get_registry().get("engine", self.engine_name, role=self.role)
            context = EngineContext(
                role=self.role,
                rank=self.rank,
                world_size=self.world_size,
                replica=self.replica,
                work_dir=self.work_dir,
            )
            started = time.monotonic()
            self.engine = spec.create(config, context)
            return {"pid": os.getpid(), "seconds": time.monotonic() - started}

    def ping(self) -> int:
        """Liveness check that never waits for the engine lock."""
        return os.getpid()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``engine.<method>(*args, **kwargs)`` if the role allows it."""
        if method not in ALLOWED_METHODS.get(self.role, frozenset()):
            raise ValueError(f"{method!r} is not an operation of a {self.role} engine")
        with self._lock:
            if self.engine is None:
                raise RuntimeError("engine is not set up")
            return getattr(self.engine, method)(*args, **kwargs)

    def global_step(self) -> int:
        """The training engine's optimizer step count."""
        with self._lock:
            return int(self.engine.global_step)

    def export_weights(self) -> bytes | None:
        """All ranks gather; rank 0 returns the full weights as one safetensors blob."""
        from safetensors.torch import save

        with self._lock:
            tensors = {
                name: t.detach().cpu().contiguous() for name, t in self.engine.named_weights()
            }
        return save(tensors) if self.rank == 0 else None

    def import_weights(self, blob: bytes) -> int:
        """Load a safetensors blob into the engine in place; returns the bytes loaded."""
        from safetensors.torch import load

        tensors = load(blob)
        with self._lock:
            self.engine.load_weights(tensors.items())
        return len(blob)

    def close(self) -> None:
        """Free the engine before the actor is killed."""
        with self._lock:
            if self.engine is not None:
                try:
                    self.engine.close()
                finally:
                    self.engine = None
