"""Importing a tracker's library, or a clear error saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from arctic_platform.rl.api import MissingDependencyError


def require(module: str, tracker: str, package: str) -> ModuleType:
    """``import module``, or ``MissingDependencyError`` naming the tracker and the package."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"tracker {tracker!r} needs the {package!r} package ({exc}); install it with "
            f"`pip install {package}` or `pip install 'arctic-platform[trackers]'`"
        ) from exc
