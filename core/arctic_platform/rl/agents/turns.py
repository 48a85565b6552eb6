"""Token-faithful prompts for the next turn of a session.

Rule. When the client's ``messages`` start with the recorded history (the previous request's
messages and the assistant message the session returned, compared as in ``history``) and the
tools are the same, the prompt is the previous prompt ids + the previous completion ids
(verbatim, as sampled) + the *bridge*: the template's text for the new messages, cut from the
full rendering right after the returned assistant turn's end-of-turn text (the eos token's
text, e.g. ``<|im_end|>``) and tokenized alone. Sampled text is never decoded and re-encoded.

Length stop. A previous completion that does not end with the eos id (stopped by ``length``,
a stop string or another stop token) gets one eos id appended before the bridge, as the
template closes every assistant turn with it; that id is not sampled (loss mask 0).

The previous turn is whichever earlier turn the request continues (``lineage``): any
choice of any earlier request, so conversations sharing a session, or the ``n`` choices of
one request each continued, keep their own segments whatever the timing.

Otherwise (first turn, edited history, other tools, or a template whose rendering cannot be
cut) the prompt is the full tokenization of the rendered conversation, in a new segment
(the session's next free number); after the first segment it is marked ``prefix_break=True``.
It is never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.history import as_dict
from arctic_platform.rl.agents.lineage import chat_parent, ids_parent
from arctic_platform.rl.agents.models import SessionState


class PromptPlan(BaseModel):
    """The prompt ids of the next turn, its segment, and how they were made: ``reused``
    leading ids copied from the ``parent`` turn, then ``bridge_ids`` (after an added eos when
    ``appended_eos``); ``break_reason`` says why a new segment began. ``continued``: how many
    of the request's messages the parent's history holds (its answer is the next one)."""

    prompt_ids: list[int]
    segment: int
    prefix_break: bool
    parent: int | None = None
    continued: int = 0
    reused: int = 0
    bridge_ids: list[int] = []
    appended_eos: bool = False
    break_reason: str | None = None


def bridge_text(
    tokenizer: ChatTokenizer,
    history: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
) -> str | None:
    """The template's text after the last message of ``history`` (which ``messages`` starts
    with) up to the generation prompt, or None when the rendering cannot be cut there.

    The cut is right after the last end-of-turn text of ``history`` rendered alone; when the
    full rendering does not start with that text (a template that rewrites earlier turns),
    after the same count of end-of-turn texts in the full rendering.
    """
    eot = tokenizer.eos_text
    before = tokenizer.render(history, tools, add_generation_prompt=False)
    full = tokenizer.render(messages, tools, add_generation_prompt=True)
    cut = before.rfind(eot)
    if cut < 0:
        return None
    head = before[: cut + len(eot)]
    if full.startswith(head):
        return full[len(head) :]
    count, at = head.count(eot), 0
    for _ in range(count):
        at = full.find(eot, at)
        if at < 0:
            return None
        at += len(eot)
    return full[at:]


def new_segment(state: SessionState, prompt_ids: list[int], reason: str | None) -> PromptPlan:
    """A plan starting the session's next free segment with ``prompt_ids`` (the caller, who
    holds the session, takes the number: ``state.next_segment`` += 1)."""
    segment = state.next_segment
    return PromptPlan(
        prompt_ids=prompt_ids,
        segment=segment,
        prefix_break=segment > 0,
        break_reason=reason if segment > 0 else None,
    )


def plan_prompt(
    tokenizer: ChatTokenizer,
    state: SessionState,
    messages: Sequence[Any],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> PromptPlan:
    """The next turn's prompt ids for ``messages`` (and ``tools``) by the module's rule."""
    sent = [as_dict(m) for m in messages]
    tool_list = [dict(t) for t in tools] if tools else None

    def full(reason: str | None) -> PromptPlan:
        text = tokenizer.render(sent, tool_list, add_generation_prompt=True)
        return new_segment(state, tokenizer.encode(text), reason)

    if not state.turns:
        return full(None)
    last, continued, reason = chat_parent(state, sent, tool_list)
    if last is None:
        return full(reason)
    text = bridge_text(tokenizer, sent[: continued + 1], sent, tool_list)
    if text is None:
        return full("the chat template's rendering cannot be cut after the assistant turn")
    reused = [*last.prompt_ids, *last.completion_ids]
    appended = not last.completion_ids or last.completion_ids[-1] != tokenizer.eos_id
    bridge = ([tokenizer.eos_id] if appended else []) + tokenizer.encode(text)
    return PromptPlan(
        prompt_ids=reused + bridge,
        segment=last.segment,
        prefix_break=False,
        parent=last.index,
        continued=continued,
        reused=len(reused),
        bridge_ids=bridge,
        appended_eos=appended,
    )


def plan_ids(state: SessionState, prompt_ids: Sequence[int]) -> PromptPlan:
    """The plan of a request whose prompt the client gave as ids: it continues the turn
    whose prompt and completion start it (``lineage.ids_parent``), else a new segment."""
    prompt = [int(i) for i in prompt_ids]
    parent = ids_parent(state, prompt)
    if parent is None:
        return new_segment(state, prompt, "the token ids continue no earlier turn")
    return PromptPlan(
        prompt_ids=prompt,
        segment=parent.segment,
        prefix_break=False,
        parent=parent.index,
        reused=len(parent.prompt_ids) + len(parent.completion_ids),
    )
