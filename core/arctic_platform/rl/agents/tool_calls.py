"""Hermes/Qwen-style tool calls parsed from the sampled ids: the ids are cut at the
``<tool_call>`` and ``</tool_call>`` token ids and only the JSON between them is decoded, so
nothing is ever re-derived from text. A call that is not valid JSON of ``{"name",
"arguments"}`` (or has no closing tag) stays in the content; parsing never raises."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.models import AssistantMessage, ToolCall, ToolCallFunction

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class ParsedCompletion(BaseModel):
    """An assistant message parsed from sampled ids, its finish reason, and where each parsed
    call lies in the ids (``[start, end)`` including both tags)."""

    message: AssistantMessage
    finish_reason: str
    call_spans: list[tuple[int, int]]


def call_id(session_id: str, turn: int, index: int) -> str:
    """The id of call ``index`` of turn ``turn`` of a session: ``call_<session>_<turn>_<i>``."""
    return f"call_{session_id}_{turn}_{index}"


def _call(payload: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of a call's JSON text, or None when it is not one."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return data["name"], arguments


def _strip_end(ids: Sequence[int], eos_id: int) -> list[int]:
    out = list(ids)
    while out and out[-1] == eos_id:
        out.pop()
    return out


def parse_completion(
    ids: Sequence[int],
    tokenizer: ChatTokenizer,
    *,
    session_id: str,
    turn: int,
    finish_reason: str = "stop",
) -> ParsedCompletion:
    """The assistant message of sampled ``ids``: content is the text outside the parsed calls
    (None when empty), finish reason ``"tool_calls"`` when any call parsed."""
    start_id = tokenizer.token_id(TOOL_CALL_START)
    end_id = tokenizer.token_id(TOOL_CALL_END)
    body = _strip_end(ids, tokenizer.eos_id)
    pieces: list[list[int]] = []  # the ids outside parsed calls, in order
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    outside: list[int] = []
    i = 0
    while i < len(body):
        if start_id is not None and end_id is not None and body[i] == start_id:
            try:
                j = body.index(end_id, i + 1)
            except ValueError:
                j = -1
            parsed = _call(tokenizer.decode(body[i + 1 : j]).strip()) if j > 0 else None
            if parsed is not None:
                name, arguments = parsed
                compact = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
                calls.append(
                    ToolCall(
                        id=call_id(session_id, turn, len(calls)),
                        function=ToolCallFunction(name=name, arguments=compact),
                    )
                )
                spans.append((i, j + 1))
                pieces.append(outside)
                outside = []
                i = j + 1
                continue
        outside.append(body[i])
        i += 1
    pieces.append(outside)
    texts = [tokenizer.decode(piece) for piece in pieces if piece]
    if calls:  # whitespace next to a call is the template's layout, not content
        content = "\n".join(t.strip() for t in texts if t.strip()) or None
        return ParsedCompletion(
            message=AssistantMessage(content=content, tool_calls=calls),
            finish_reason="tool_calls",
            call_spans=spans,
        )
    text = "".join(texts)
    return ParsedCompletion(
        message=AssistantMessage(content=text or None),
        finish_reason=finish_reason,
        call_spans=[],
    )
