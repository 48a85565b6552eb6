"""Server-sent events of a streamed ``/chat/completions`` turn (pure: no server).

The turn is sampled and recorded whole first, then streamed: ``chat.completion.chunk``s in the
order of the sampled ids (a role chunk, one chunk per run of content ids, one per tool call with
``delta.tool_calls``), a last chunk with ``finish_reason``, a usage chunk when
``stream_options.include_usage`` is set, then ``data: [DONE]``. With ``return_token_ids`` the
first chunk carries ``prompt_token_ids`` and every chunk its ``token_ids`` (vLLM's fields), so
the chunks' ids join to exactly the sampled ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.models import SessionTurn
from arctic_platform.rl.agents.openai_api import (
    ChatCompletionBody,
    answer_head,
    logprob_content,
    turn_usage,
)
from arctic_platform.rl.agents.tool_calls import ParsedCompletion

DONE = "data: [DONE]\n\n"


def _pieces(ids: Sequence[int], parsed: ParsedCompletion) -> list[tuple[int, int, int | None]]:
    """``(start, end, call)`` runs of ``ids`` in order: content (``call`` None) or call i."""
    out: list[tuple[int, int, int | None]] = []
    at = 0
    for index, (start, end) in enumerate(parsed.call_spans):
        if start > at:
            out.append((at, start, None))
        out.append((start, end, index))
        at = end
    if at < len(ids):
        out.append((at, len(ids), None))
    return out


def chat_chunks(
    body: ChatCompletionBody,
    turn: SessionTurn,
    parsed: ParsedCompletion,
    completion: Mapping[str, Any],
    tokenizer: ChatTokenizer,
    *,
    session_id: str,
    model: str,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk``s of a recorded ``turn`` (``parsed``: its message)."""
    ids = list(turn.completion_ids)
    head = answer_head("chat.completion.chunk", "chatcmpl", session_id, turn.index, model)
    top = completion.get("top_logprobs") if body.logprobs and body.top_logprobs else None

    def chunk(delta: dict[str, Any], start: int, end: int, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        if body.logprobs:
            content = logprob_content(
                tokenizer,
                ids[start:end],
                turn.completion_log_probs[start:end],
                top[start:end] if top is not None else None,
                as_ids=body.return_tokens_as_token_ids,
            )
            choice["logprobs"] = {"content": content}
        if body.return_token_ids:
            choice["token_ids"] = ids[start:end]
        return {**head, "choices": [choice]}

    first = chunk({"role": "assistant", "content": ""}, 0, 0, None)
    if body.return_token_ids:
        first["prompt_token_ids"] = list(turn.prompt_ids)
    chunks = [first]
    calls = parsed.message.tool_calls or []
    end_of_text = len(ids)
    while end_of_text > 0 and ids[end_of_text - 1] == tokenizer.eos_id:
        end_of_text -= 1  # the eos ids go with the last chunk
    for start, end, call in _pieces(ids[:end_of_text], parsed):
        if call is None:
            text = tokenizer.decode(ids[start:end])
            chunks.append(chunk({"content": text.strip() if calls else text}, start, end, None))
            continue
        tool = calls[call]
        delta = {
            "tool_calls": [
                {
                    "index": call,
                    "id": tool.id,
                    "type": "function",
                    "function": {"name": tool.function.name, "arguments": tool.function.arguments},
                }
            ]
        }
        chunks.append(chunk(delta, start, end, None))
    chunks.append(chunk({}, end_of_text, len(ids), turn.finish_reason))
    if body.return_token_ids:
        last = chunks[-1]["choices"][0]
        last["weight_version_start"] = turn.weight_version_start
        last["weight_version_end"] = turn.weight_version_end
    options = body.stream_options or {}
    if options.get("include_usage"):
        chunks.append({**head, "choices": [], "usage": turn_usage(turn)})
    return chunks


def sse_events(chunks: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``."""
    for item in chunks:
        yield f"data: {json.dumps(item, ensure_ascii=False, separators=(',', ':'))}\n\n"
    yield DONE


__all__ = ["DONE", "chat_chunks", "sse_events"]
