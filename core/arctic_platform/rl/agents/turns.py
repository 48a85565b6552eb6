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

After a request with ``n`` choices the client may continue any one of them: the one whose
assistant message it sent back is the previous turn.

Otherwise (first turn, edited history, other tools, or a template whose rendering cannot be
cut) the prompt is the full tokenization of the rendered conversation; after the first turn
that starts a new segment with ``prefix_break=True``. It is never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.history import as_dict, history_mismatch, same_tools
from arctic_platform.rl.agents.models import SessionState


class PromptPlan(BaseModel):
    """The prompt ids of the next turn, its segment, and how they were made: ``reused``
    leading ids copied from the previous turn, then ``bridge_ids`` (after an added eos when
    ``appended_eos``); ``break_reason`` says why a new segment began."""

    prompt_ids: list[int]
    segment: int
    prefix_break: bool
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


def plan_prompt(
    tokenizer: ChatTokenizer,
    state: SessionState,
    messages: Sequence[Any],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> PromptPlan:
    """The next turn's prompt ids for ``messages`` (and ``tools``) by the module's rule."""
    sent = [as_dict(m) for m in messages]
    tool_list = [dict(t) for t in tools] if tools else None
    last = state.turns[-1] if state.turns else None

    def full(reason: str | None) -> PromptPlan:
        text = tokenizer.render(sent, tool_list, add_generation_prompt=True)
        return PromptPlan(
            prompt_ids=tokenizer.encode(text),
            segment=0 if last is None else last.segment + 1,
            prefix_break=last is not None,
            break_reason=reason,
        )

    if last is None:
        return full(None)
    history = state.last_messages or []
    if not same_tools(state.last_tools, tool_list):
        return full("the tools differ from the previous request's")
    choices = [state.turns[i] for i in state.last_choices] or [last]
    reason = history_mismatch(history, choices[0].message.to_openai(), sent)
    for choice in choices:  # the choice (of n) whose message the client sent back
        if history_mismatch(history, choice.message.to_openai(), sent) is None:
            last, reason = choice, None
            break
    if reason is not None:
        return full(reason)
    text = bridge_text(tokenizer, sent[: len(history) + 1], sent, tool_list)
    if text is None:
        return full("the chat template's rendering cannot be cut after the assistant turn")
    reused = [*last.prompt_ids, *last.completion_ids]
    appended = not last.completion_ids or last.completion_ids[-1] != tokenizer.eos_id
    bridge = ([tokenizer.eos_id] if appended else []) + tokenizer.encode(text)
    return PromptPlan(
        prompt_ids=reused + bridge,
        segment=last.segment,
        prefix_break=False,
        reused=len(reused),
        bridge_ids=bridge,
        appended_eos=appended,
    )
