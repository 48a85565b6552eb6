"""Demonstrations of the lookup task as a ``cross_entropy`` batch, with the loss on the
assistant turns only.

A conversation is rendered by the model's chat template the way an agent session builds it:
turn 1's prompt (system with the tool, user, generation prompt), the assistant's call up to
and including its eos, the bridge (what the template writes after that eos, the tool result
and the next generation prompt), the answer up to and including its eos. Each piece is encoded
on its own, as the session does, and ``loss_mask`` is 1 exactly on the two assistant pieces.

``with_tools=False`` renders the same conversation without the template's tool block (about
235 of its 320 tokens): the warm start's short-context curriculum, where the tiny model learns
to copy digits quickly; the copy is at the same relative offsets with the tool block, so it
carries over after a few full-length steps.
"""

from __future__ import annotations

from typing import Any, Protocol

from arctic_rl_demo.tasks.lookup.task import Episode, demonstration_messages, tool_schema


class ChatTemplateTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    eos_token: str

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def _render(
    tokenizer: ChatTemplateTokenizer,
    messages: list[dict[str, Any]],
    gen: bool,
    with_tools: bool = True,
) -> str:
    text = tokenizer.apply_chat_template(
        messages,
        tools=[tool_schema()] if with_tools else None,
        tokenize=False,
        add_generation_prompt=gen,
    )
    return str(text)


def _assistant_piece(before: str, after: str, eos: str) -> str:
    """The assistant turn ``after`` adds to ``before``, cut just after its eos."""
    if not after.startswith(before):
        raise ValueError("the chat template rewrote earlier turns; demonstrations need prefixes")
    added = after[len(before) :]
    end = added.find(eos)
    if end < 0:
        raise ValueError(f"an assistant turn does not end with the eos {eos!r}")
    return added[: end + len(eos)]


def demonstration_pieces(
    tokenizer: ChatTemplateTokenizer,
    episode: Episode,
    with_tools: bool = True,
    answer: str | None = None,
) -> list[tuple[str, int]]:
    """The conversation's text pieces, each with 1 when the loss covers it, else 0
    (``answer``: the final answer shown instead of the tool's value)."""
    messages = demonstration_messages(episode, answer)
    eos = tokenizer.eos_token

    def render(count: int, gen: bool) -> str:
        return _render(tokenizer, messages[:count], gen, with_tools)

    prompt = render(2, gen=True)
    call = _assistant_piece(prompt, render(3, gen=False), eos)
    second = render(4, gen=True)
    if not second.startswith(prompt + call):
        raise ValueError("turn 2's prompt does not extend turn 1's prompt and call")
    bridge = second[len(prompt + call) :]
    answer = _assistant_piece(second, render(len(messages), gen=False), eos)
    return [(prompt, 0), (call, 1), (bridge, 0), (answer, 1)]


def demonstration_row(
    tokenizer: ChatTemplateTokenizer,
    episode: Episode,
    with_tools: bool = True,
    answer: str | None = None,
) -> tuple[list[int], list[int]]:
    """One demonstration's token ids and loss mask (1 on the assistant turns' tokens)."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in demonstration_pieces(tokenizer, episode, with_tools, answer):
        piece = list(tokenizer.encode(text, add_special_tokens=False))
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def prompt_ids(tokenizer: ChatTemplateTokenizer, episode: Episode) -> list[int]:
    """Turn 1's prompt ids as a demonstration renders them (to check against a session's)."""
    text = _render(tokenizer, demonstration_messages(episode)[:2], gen=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def sft_batch(
    tokenizer: ChatTemplateTokenizer,
    episodes: list[Episode],
    with_tools: bool = True,
    answers: list[str | None] | None = None,
) -> dict[str, Any]:
    """A ``cross_entropy`` batch of demonstrations (``with_tools=False``: without the tool
    block, the short-context curriculum; ``answers``: per episode the answer shown, None
    for the tool's value)."""
    shown = answers if answers is not None else [None] * len(episodes)
    pairs = zip(episodes, shown, strict=True)
    rows = [demonstration_row(tokenizer, e, with_tools, a) for e, a in pairs]
    return {"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]}
