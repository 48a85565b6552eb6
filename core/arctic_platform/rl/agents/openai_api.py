"""The OpenAI-compatible request bodies of agent sessions and the answers built from a sampled
turn: ``/chat/completions`` and vLLM's token-in ``/inference/v1/generate`` (pure: no server).

A malformed body is a ``BadRequestError`` (400), so the ``openai`` client raises its own
``BadRequestError``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.models import SessionTurn
from arctic_platform.rl.agents.response_format import response_format_constraint, response_schema
from arctic_platform.rl.agents.tool_choice import forced_tools, tool_call_constraint
from arctic_platform.rl.errors import BadRequestError
from arctic_platform.rl.wire.requests import describe_errors

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""A ``seed`` is a signed 64-bit integer (as in vLLM's OpenAI server)."""


class ChatCompletionBody(BaseModel):
    """The fields of an OpenAI chat-completions request that a session honours (others are
    accepted and ignored, as vLLM does); ``return_token_ids`` is vLLM's extra."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class TokenGenerateBody(BaseModel):
    """vLLM's token-in generate request: ``token_ids`` and ``sampling_params``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    token_ids: list[int] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)


def parse_body(model: type[BaseModel], body: Any) -> Any:
    """``body`` validated as ``model``; a ``BadRequestError`` naming the fields otherwise."""
    if not isinstance(body, Mapping):
        raise BadRequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(dict(body))
    except ValidationError as exc:
        raise BadRequestError(f"invalid request: {describe_errors(exc)}") from None


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse (400) messages that are not chat messages of a known role."""
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise BadRequestError(
                f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequestError(f"messages[{i}].content must be a string, a list or null")
        if role != "assistant" and content is None:
            raise BadRequestError(f"messages[{i}] ({role}) has no content")
        calls = message.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list)):
            raise BadRequestError(f"messages[{i}].tool_calls must be an assistant's list")


def check_chat(body: ChatCompletionBody) -> None:
    """Refuse (400) what this server does not do: ``n`` > 1 streamed, a tool that is not a
    named function with a valid JSON schema (whatever the ``tool_choice``), a ``tool_choice``
    naming no tool, a ``response_format`` it does not know."""
    check_messages(body.messages)
    if (body.n or 1) > 1 and body.stream:
        raise BadRequestError("n > 1 is not streamed on a session; send stream=false")
    forced_tools(body.tool_choice, body.tools)
    response_schema(body.response_format)


def chat_sampling_params(
    body: ChatCompletionBody, tokenizer: ChatTokenizer, room: int | None
) -> dict[str, Any]:
    """The vLLM sampling params of a chat request; ``room``: tokens left in the context
    (the default ``max_tokens``). ``tool_choice="none"`` stops at a ``<tool_call>`` token;
    ``"required"`` or a named tool constrains decoding to one call (``tool_choice``), a JSON
    ``response_format`` to JSON of its schema (``response_format``); a forced call wins over
    the format (as in vLLM: agent frameworks send both, the format is for the final answer)."""
    params: dict[str, Any] = {"n": body.n or 1}
    max_tokens = fit_max_tokens(body.max_completion_tokens or body.max_tokens, room)
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    params.update(plain_sampling_params(body))
    if body.logprobs and body.top_logprobs:
        params["logprobs"] = body.top_logprobs
    forced = forced_tools(body.tool_choice, body.tools)
    shaped = response_format_constraint(body.response_format, tokenizer)
    if forced:
        params["structured_outputs"] = tool_call_constraint(forced, tokenizer)
    elif shaped:
        params["structured_outputs"] = shaped
    if body.tool_choice == "none" and body.tools:
        start = tokenizer.token_id("<tool_call>")
        if start is not None:
            params["stop_token_ids"] = [start]
    return params


def fit_max_tokens(asked: int | None, room: int | None, default: int | None = None) -> int | None:
    """The ``max_tokens`` to sample with, ``room`` being the tokens the prompt leaves in the
    context (None: unknown). A ``max_tokens`` the client ``asked`` for that does not fit is a
    400, as vLLM answers (never silently cut); without one, ``default`` cut to the room, else
    the whole room."""
    if asked is not None:
        if room is not None and asked > room:
            raise BadRequestError(
                f"max_tokens={asked} does not fit: the prompt leaves {room} tokens of the "
                "model's context (max_model_len); ask for at most that many, or leave "
                "max_tokens out to use them all"
            )
        return asked
    if default is None or room is None:
        return default if room is None else room
    return max(1, min(default, room))


def turn_usage(*turns: SessionTurn) -> dict[str, int]:
    """OpenAI's ``usage`` of the choices of one request (sibling turns of one prompt): prompt,
    completion and total token counts."""
    prompt = len(turns[0].prompt_ids)
    completion = sum(len(turn.completion_ids) for turn in turns)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def answer_head(kind: str, prefix: str, session_id: str, index: int, model: str) -> dict[str, Any]:
    """The fields an OpenAI answer (or stream chunk) starts with: ``id``
    (``{prefix}-{session}-{turn index}``), ``object`` (``kind``), ``created`` and ``model``."""
    return {
        "id": f"{prefix}-{session_id}-{index}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def plain_sampling_params(body: Any) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``seed`` (when set) and ``stop`` (as a list) of a chat or
    completions request, as vLLM sampling params."""
    params: dict[str, Any] = {}
    for name in ("temperature", "top_p", "seed"):
        value = getattr(body, name)
        if value is not None:
            params[name] = value
    if body.stop is not None:
        params["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    return params


def _token_text(tokenizer: ChatTokenizer, token_id: int, as_ids: bool) -> str:
    if as_ids:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def logprob_content(
    tokenizer: ChatTokenizer,
    ids: Sequence[int],
    log_probs: Sequence[float],
    top: Sequence[Sequence[Sequence[float]]] | None = None,
    *,
    as_ids: bool = False,
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content``: one entry per sampled id (``token_id`` added, vLLM-style),
    with ``top_logprobs`` from ``top`` ([[id, logprob], ...] per position) when given."""
    out = []
    for i, (token_id, value) in enumerate(zip(ids, log_probs, strict=True)):
        text = _token_text(tokenizer, int(token_id), as_ids)
        alternatives = []
        for pair in (top[i] if top is not None and i < len(top) else []) or []:
            alt = _token_text(tokenizer, int(pair[0]), as_ids)
            alternatives.append(
                {"token": alt, "logprob": float(pair[1]), "bytes": list(alt.encode())}
            )
        out.append(
            {
                "token": text,
                "token_id": int(token_id),
                "logprob": float(value),
                "bytes": list(text.encode()),
                "top_logprobs": alternatives,
            }
        )
    return out


Choice = tuple[SessionTurn, Mapping[str, Any]]
"""One recorded choice of a request: its turn and the engine's completion record."""


def choices_answer(
    kind: str,
    prefix: str,
    choices: Sequence[Choice],
    out: list[dict[str, Any]],
    session_id: str,
    model: str,
) -> dict[str, Any]:
    """The ``kind`` answer of a request's recorded ``choices``, rendered as ``out``: its head
    (``answer_head``, id of the first turn), the choices and their ``usage``."""
    head = answer_head(kind, prefix, session_id, choices[0][0].index, model)
    return {**head, "choices": out, "usage": turn_usage(*(turn for turn, _ in choices))}


def chat_response(
    body: ChatCompletionBody,
    choices: Sequence[Choice],
    tokenizer: ChatTokenizer,
    *,
    session_id: str,
    model: str,
) -> dict[str, Any]:
    """The ``chat.completion`` answer of a request's recorded choices (``n`` of them); token
    ids and weight versions only with ``return_token_ids``, log-probs only with ``logprobs``."""
    out = []
    for number, (turn, completion) in enumerate(choices):
        choice: dict[str, Any] = {
            "index": number,
            "message": turn.message.to_openai(),
            "finish_reason": turn.finish_reason,
            "logprobs": None,
        }
        if body.logprobs:
            content = logprob_content(
                tokenizer,
                turn.completion_ids,
                turn.completion_log_probs,
                completion.get("top_logprobs") if body.top_logprobs else None,
                as_ids=body.return_tokens_as_token_ids,
            )
            choice["logprobs"] = {"content": content}
        if body.return_token_ids:
            choice.update(_token_fields(turn))
        out.append(choice)
    answer = choices_answer("chat.completion", "chatcmpl", choices, out, session_id, model)
    if body.return_token_ids:
        answer["prompt_token_ids"] = list(choices[0][0].prompt_ids)
    return answer


def _token_fields(turn: SessionTurn) -> dict[str, Any]:
    """A choice's ``token_ids`` and weight versions (``return_token_ids``)."""
    fields: dict[str, Any] = {
        "token_ids": list(turn.completion_ids),
        "weight_version_start": turn.weight_version_start,
        "weight_version_end": turn.weight_version_end,
    }
    if turn.weight_version_spans:
        fields["weight_version_spans"] = turn.weight_version_spans
    return fields


def generate_response(
    choices: Sequence[Choice],
    tokenizer: ChatTokenizer,
    *,
    session_id: str,
    model: str,
) -> dict[str, Any]:
    """vLLM's token-in generate answer: per choice ``token_ids``, ``logprobs.content``
    (``token`` is ``"token_id:N"``, and ``token_id``) and ``finish_reason``."""
    first = choices[0][0]
    out = []
    for number, (turn, completion) in enumerate(choices):
        content = logprob_content(
            tokenizer,
            turn.completion_ids,
            turn.completion_log_probs,
            completion.get("top_logprobs"),
            as_ids=True,
        )
        out.append(
            {
                "index": number,
                "token_ids": list(turn.completion_ids),
                "logprobs": {"content": content},
                "finish_reason": str(completion.get("finish_reason") or turn.finish_reason),
                "weight_version_start": turn.weight_version_start,
                "weight_version_end": turn.weight_version_end,
            }
        )
    return {
        "id": f"gen-{session_id}-{first.index}",
        "request_id": f"gen-{session_id}-{first.index}",
        "object": "generate",
        "model": model,
        "prompt_token_ids": list(first.prompt_ids),
        "choices": out,
        "usage": turn_usage(*(turn for turn, _ in choices)),
    }


__all__ = [
    "ChatCompletionBody",
    "Choice",
    "TokenGenerateBody",
    "answer_head",
    "chat_response",
    "chat_sampling_params",
    "check_chat",
    "check_messages",
    "choices_answer",
    "fit_max_tokens",
    "generate_response",
    "logprob_content",
    "parse_body",
    "plain_sampling_params",
    "turn_usage",
]
