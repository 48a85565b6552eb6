"""The demo's tasks, one folder each, every one exposing its ``DemoTask`` as ``TASK``.

``TASKS`` is the one list of them (``--task``'s choices and help): a new task is its folder
and one line here. A task's modules are imported only when it runs (``load_task``).
"""

from __future__ import annotations

import importlib

from arctic_rl_demo.runner import DemoTask

TASKS: dict[str, str] = {
    "reverse": "digit reversal (default)",
    "lookup": "an openai-agents agent that must call a lookup(key) tool and answer with its value",
}
"""Each task's name (its folder) and what it is, the default first."""


def load_task(name: str) -> DemoTask:
    """The ``DemoTask`` of the task ``name`` (its folder's ``TASK``)."""
    task: DemoTask = importlib.import_module(f"{__name__}.{name}").TASK
    return task
