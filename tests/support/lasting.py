"""Session resources that end after their last test, not at the end of the session.

A session (or directory "package") fixture of a folder without ``__init__.py`` lives until
the session ends: a server or engine shared by a few modules would idle through every test
after them. A fixture hands its closer to ``until_last_use``; the ``pytest_runtest_teardown``
hook of ``tests/conftest.py`` calls ``release_after`` after each test's own teardown, which
closes what no later test of the session uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

_OPEN: dict[str, Callable[[], None]] = {}  # fixture name -> its closer (run once)
_LAST: dict[str, str] = {}  # fixture name -> node id of the session's last test using it


def until_last_use(name: str, close: Callable[[], None]) -> Callable[[], None]:
    """Run ``close`` after the session's last test that uses fixture ``name``, or when the
    returned function is called (the fixture's own teardown), whichever comes first; once."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            _OPEN.pop(name, None)
            close()

    _OPEN[name] = once
    return once


def uses(item: pytest.Item, name: str) -> bool:
    """Whether ``item`` asks for fixture ``name`` (directly or through another fixture)."""
    return name in getattr(item, "fixturenames", ())


def release_after(item: pytest.Item) -> None:
    """Close every open resource whose last test in the session is ``item``."""
    for name, close in list(_OPEN.items()):
        if not uses(item, name):
            continue
        if name not in _LAST:
            later = (other for other in reversed(item.session.items) if uses(other, name))
            _LAST[name] = next(later, item).nodeid
        if item.nodeid == _LAST[name]:
            close()
