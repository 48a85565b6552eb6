"""OpenAI's legacy ``/completions`` on an agent session (pure: no server): the request body,
its prompt as token ids (text encoded as written, or ids taken verbatim), its sampling params
and the ``text_completion`` answer of a recorded turn.

One prompt per request, as a session is one trajectory (``n`` choices are sibling turns);
``echo``, ``suffix`` and ``best_of`` > 1 are refused with a 400 rather than ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.models import SessionTurn
from arctic_platform.rl.agents.openai_api import (
    SEED_MAX,
    SEED_MIN,
    Choice,
    choices_answer,
    fit_max_tokens,
    plain_sampling_params,
)
from arctic_platform.rl.errors import BadRequestError

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/completions`` (vLLM follows it)."""


class CompletionBody(BaseModel):
    """The fields of an OpenAI completions request that a session honours (others are
    accepted and ignored, as vLLM does); ``return_token_ids`` is vLLM's extra."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    stream: bool | None = None
    return_token_ids: bool = False


def check_completion(body: CompletionBody) -> None:
    """Refuse (400) what a session does not do: several prompts, ``best_of`` > 1, ``echo``,
    ``suffix``, streaming."""
    if (body.best_of or 1) > 1:
        raise BadRequestError("best_of > 1 is not supported on a session; send n instead")
    if body.echo:
        raise BadRequestError(
            "echo is not supported on a session (the prompt ids are in the "
            "answer with return_token_ids)"
        )
    if body.suffix is not None:
        raise BadRequestError("suffix is not supported")
    if body.stream:
        raise BadRequestError("stream is not supported on /completions; use /chat/completions")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise BadRequestError(
                f"one prompt per request on a session (a session is one trajectory), "
                f"got {len(prompt)}"
            )


def completion_prompt_ids(body: CompletionBody, tokenizer: ChatTokenizer) -> list[int]:
    """The prompt as token ids: text encoded as written (no special tokens added), ids
    verbatim; an empty prompt is a 400."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
    if not ids:
        raise BadRequestError("the prompt is empty")
    return ids


def completion_sampling_params(body: CompletionBody, room: int | None) -> dict[str, Any]:
    """The vLLM sampling params of a completions request; ``room``: tokens left in the
    context (a ``max_tokens`` past it is a 400; the default is cut to it)."""
    params: dict[str, Any] = {"n": body.n or 1}
    params["max_tokens"] = fit_max_tokens(body.max_tokens, room, DEFAULT_MAX_TOKENS)
    params.update(plain_sampling_params(body))
    if body.logprobs:
        params["logprobs"] = body.logprobs
    return params


def _legacy_logprobs(
    tokenizer: ChatTokenizer,
    turn: SessionTurn,
    top: list[list[list[float]]] | None,
) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs``: tokens, their log-probs, top alternatives, offsets."""
    tokens = [tokenizer.decode([i], skip_special_tokens=False) for i in turn.completion_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    alternatives = None
    if top is not None:
        alternatives = [
            {tokenizer.decode([int(p[0])], skip_special_tokens=False): float(p[1]) for p in step}
            for step in top
        ]
    return {
        "tokens": tokens,
        "token_logprobs": list(turn.completion_log_probs),
        "top_logprobs": alternatives,
        "text_offset": offsets,
    }


def completion_response(
    body: CompletionBody,
    choices: Sequence[Choice],
    tokenizer: ChatTokenizer,
    *,
    session_id: str,
    model: str,
) -> dict[str, Any]:
    """The ``text_completion`` answer of a request's recorded choices; with
    ``return_token_ids`` each choice carries ``prompt_token_ids`` and ``token_ids`` (vLLM's
    names) and the weight versions."""
    out = []
    for number, (turn, completion) in enumerate(choices):
        choice: dict[str, Any] = {
            "index": number,
            "text": str(completion.get("text") or tokenizer.decode(turn.completion_ids)),
            "logprobs": None,
            "finish_reason": turn.finish_reason,
        }
        if body.logprobs is not None:
            top = completion.get("top_logprobs") if body.logprobs else None
            choice["logprobs"] = _legacy_logprobs(tokenizer, turn, top)
        if body.return_token_ids:
            choice["prompt_token_ids"] = list(turn.prompt_ids)
            choice["token_ids"] = list(turn.completion_ids)
            choice["weight_version_start"] = turn.weight_version_start
            choice["weight_version_end"] = turn.weight_version_end
        out.append(choice)
    return choices_answer("text_completion", "cmpl", choices, out, session_id, model)


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "CompletionBody",
    "check_completion",
    "completion_prompt_ids",
    "completion_response",
    "completion_sampling_params",
]
