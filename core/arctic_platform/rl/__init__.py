"""Arctic RL: one client for the training, sampling and log-prob jobs of RL post-training.

Importing this package is light: torch, ray, vllm and deepspeed load only in the code
paths that use them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ArcticRLClientConfig": "arctic_platform.rl.config",
    "WeightSyncConfig": "arctic_platform.rl.config",
    "ArcticRLClient": "arctic_platform.rl.client",
    "AsyncArcticRLClient": "arctic_platform.rl.client",
    "ArcticRLError": "arctic_platform.rl.errors",
    "RunTracker": "arctic_platform.rl.tracking",
    "group_advantages": "arctic_platform.rl.sampled_batch",
    "rollout_batch": "arctic_platform.rl.sampled_batch",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'arctic_platform.rl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
