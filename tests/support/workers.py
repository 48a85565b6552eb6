"""How the suite splits over pytest-xdist workers (``./run.sh test`` runs two).

Every test gets an ``xdist_group`` mark, and ``--dist loadgroup`` runs each group whole, in
collection order, on one worker. A group is a module (its module fixtures start once, its
tests keep their order), joined with every other module that shares one of the heavy shared
fixtures (a live server, engines, a Tinker server: started once per worker that uses them) or
the network namespaces of the multi-node suite (one cluster at a time on the machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

HEAVY_SHARED_FIXTURES = (
    "live",
    "agents_rl",
    "vllm_sampling_engine",
    "vllm_log_prob_engine",
    "tinker_server",
    "platform_live",
)
"""Session- or package-scoped fixtures that start servers or engines."""

ONE_AT_A_TIME = ("tests/multinode/",)
"""Folders whose modules all run in one group (they share machine-wide state)."""


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def group_names(items: list[pytest.Item]) -> dict[str, str]:
    """Module path -> its group's name: modules joined by a shared heavy fixture or folder."""
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def join(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for item in items:
        module = _module(item)
        find(module)
        for folder in ONE_AT_A_TIME:
            if module.startswith(folder):
                join(module, folder)
        for fixture in HEAVY_SHARED_FIXTURES:
            if fixture in getattr(item, "fixturenames", ()):
                join(module, f"fixture:{fixture}")
    return {module: find(module) for module in {_module(item) for item in items}}


def mark_groups(items: list[pytest.Item]) -> None:
    """Give every item the ``xdist_group`` of its module's group."""
    import pytest

    groups = group_names(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[_module(item)]))
