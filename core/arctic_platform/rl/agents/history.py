"""Whether a client's messages re-send the history a session recorded, compared by meaning.

Rule: roles equal; content equal as text (``None`` == ``""``, a list of text parts is their
joined text); tool calls equal by function name and parsed JSON arguments (a string or an
object, key order and spacing ignored); tool-call ids and ``tool_call_id`` are ignored (the
template renders none of them and clients may regenerate them); ``name`` is compared only when
both sides give one. The assistant message the session returned also matches when its content
differs only in leading or trailing whitespace (clients trim it). Tools compare as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def content_text(content: Any) -> str:
    """A message's content as text: ``None`` is ``""``, text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(parts)
    return json.dumps(content, sort_keys=True, default=str)


def _arguments(value: Any) -> Any:
    """Tool-call arguments by meaning: a JSON string parsed, else the value as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _calls(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            out.append(("", json.dumps(call, default=str)))
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else call
        name = str(function.get("name") or "")
        arguments = _arguments(function.get("arguments"))
        out.append((name, json.dumps(arguments, sort_keys=True, default=str)))
    return out


def _field(message: Any, name: str) -> Any:
    if isinstance(message, Mapping):
        return message.get(name)
    return getattr(message, name, None)


def as_dict(message: Any) -> dict[str, Any]:
    """A message (a dict or a pydantic model) as a plain dict."""
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        return dict(dump(exclude_none=True))
    raise TypeError(f"a chat message is a dict, got {type(message).__name__}")


def same_message(recorded: Any, sent: Any, *, trim_content: bool = False) -> bool:
    """Whether ``sent`` re-sends ``recorded`` by the rule of this module."""
    a, b = as_dict(recorded), as_dict(sent)
    if a.get("role") != b.get("role"):
        return False
    text_a, text_b = content_text(a.get("content")), content_text(b.get("content"))
    if trim_content:
        text_a, text_b = text_a.strip(), text_b.strip()
    if text_a != text_b:
        return False
    if a.get("name") is not None and b.get("name") is not None and a["name"] != b["name"]:
        return False
    return _calls(a) == _calls(b)


def same_tools(
    recorded: Sequence[Mapping[str, Any]] | None, sent: Sequence[Mapping[str, Any]] | None
) -> bool:
    """Whether two tool lists are the same JSON (no tools == an empty list)."""

    def key(tools: Sequence[Mapping[str, Any]] | None) -> str:
        return json.dumps([dict(t) for t in tools or []], sort_keys=True, default=str)

    return key(recorded) == key(sent)


def history_mismatch(history: Sequence[Any], returned: Any, messages: Sequence[Any]) -> str | None:
    """Why ``messages`` does not start with ``history`` followed by the ``returned``
    assistant message, or None when it does."""
    if len(messages) < len(history) + 1:
        return f"{len(messages)} messages do not re-send the {len(history) + 1} recorded"
    for i, (old, new) in enumerate(zip(history, messages, strict=False)):
        if not same_message(old, new):
            return f"message {i} differs from the recorded one"
    if not same_message(returned, messages[len(history)], trim_content=True):
        return f"message {len(history)} is not the assistant message the session returned"
    return None
