"""Engines as a job's worker builds them: through the plugin registry, with an engine context."""

from __future__ import annotations

from typing import Any


def registry_engine(name: str, role: str, config: Any) -> Any:
    """The registered engine ``name`` for ``role``, created from ``config``."""
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry

    return get_registry().get("engine", name, role=role).create(config, EngineContext(role=role))
