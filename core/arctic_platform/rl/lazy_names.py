"""Module attributes imported on first use: one ``__getattr__``/``__dir__`` pair for a module.

A module that re-exports heavy names sets ``__getattr__, __dir__ = lazy_names(__name__,
{name: defining_module})``; a name is imported when first asked for, then kept.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(
    module_name: str, lazy: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``module_name`` serving ``lazy`` on demand."""

    def getattr_(name: str) -> Any:
        source = lazy.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[module_name]), *lazy})

    return getattr_, dir_
