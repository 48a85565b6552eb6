"""The ``lookup`` function tool the agent-session tests offer the model (OpenAI's tool form)."""

from __future__ import annotations

from typing import Any


def lookup_tool(*, strict: bool = True, closed: bool = True) -> dict[str, Any]:
    """The ``lookup`` tool (one string ``key``); ``strict``: marked strict; ``closed``: its
    parameters allow no other property (``additionalProperties`` false)."""
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
    }
    if closed:
        parameters["additionalProperties"] = False
    function: dict[str, Any] = {
        "name": "lookup",
        "description": "Look up the value stored under a key",
        "parameters": parameters,
    }
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}
