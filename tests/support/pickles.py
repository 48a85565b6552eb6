"""A pickle that proves it was loaded: for tests that a server never unpickles a request."""

from __future__ import annotations

from pathlib import Path


class Tripwire:
    """Unpickling this creates ``path``: proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.path,))
