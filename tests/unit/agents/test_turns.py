"""Token-faithful turns: turn k>1's prompt is the previous prompt ids + the sampled ids + only
the template's bridge ids, as long as the client re-sends the recorded history; an edited
history starts a new segment (``prefix_break``), never an error."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from arctic_platform.rl.agents import AgentSession, SessionState

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>'
USER = [{"role": "user", "content": "value of key 4821?"}]


def _session() -> SessionState:
    return SessionState(session_id="s1", model="tiny")


def _log_probs(ids: list[int]) -> list[float]:
    return [-0.01 * (i + 1) for i in range(len(ids))]


def _turn(session: AgentSession, messages: Any, tools: Any, ids: list[int], **kw: Any) -> Any:
    plan = session.prompt(messages, tools)
    turn, parsed = session.record(plan, messages, tools, ids, _log_probs(ids), **kw)
    return plan, turn, parsed


def _agents_history(parsed: Any, result: str = "1234") -> list[dict[str, Any]]:
    """Turn 2's messages as openai-agents sends them: the assistant turn with null content
    and the tool calls (arguments = the exact string returned), then the tool result."""
    calls = [c.model_dump() for c in parsed.message.tool_calls]
    return [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": result},
    ]


@pytest.fixture
def session(chat_tok: Any) -> AgentSession:
    return AgentSession(_session(), chat_tok)


def test_first_turn_is_the_full_tokenization(session: AgentSession, chat_tok: Any, tools):
    plan = session.prompt(USER, tools)
    assert plan.prompt_ids == chat_tok.encode(chat_tok.render(USER, tools))
    assert (plan.segment, plan.prefix_break, plan.reused) == (0, False, 0)
    assert plan.prompt_ids[-3:] == chat_tok.encode("<|im_start|>assistant\n")


def test_two_turn_tool_episode_as_openai_agents_sends_it(
    session: AgentSession, chat_tok: Any, tools: Any
) -> None:
    ids1 = [*chat_tok.encode(CALL), chat_tok.eos_id]
    _plan1, turn1, parsed = _turn(session, USER, tools, ids1)
    assert parsed.finish_reason == "tool_calls"
    assert parsed.message.tool_calls[0].function.arguments == '{"key":"4821"}'
    messages = _agents_history(parsed)
    plan2 = session.prompt(messages, tools)
    head = turn1.prompt_ids + turn1.completion_ids
    assert plan2.prompt_ids[: len(head)] == head
    assert (plan2.prefix_break, plan2.segment, plan2.reused) == (False, 0, len(head))
    assert not plan2.appended_eos
    bridge = "\n<|im_start|>user\n<tool_response>\n1234\n</tool_response><|im_end|>\n"
    assert chat_tok.decode(plan2.bridge_ids, skip_special_tokens=False) == (
        bridge + "<|im_start|>assistant\n"
    )
    # the bridge ids are the tail of the full tokenization: only the new messages' tokens
    full = chat_tok.encode(chat_tok.render(messages, tools))
    assert full[-len(plan2.bridge_ids) :] == plan2.bridge_ids
    ids2 = [*chat_tok.encode("The value is 1234"), chat_tok.eos_id]
    turn2, parsed2 = session.record(plan2, messages, tools, ids2, _log_probs(ids2))
    assert (turn2.index, turn2.segment, turn2.prefix_break) == (1, 0, False)
    assert turn2.prompt_ids == plan2.prompt_ids
    assert turn2.completion_ids == ids2
    assert parsed2.message.content == "The value is 1234"


def test_history_without_call_ids_or_with_other_spacing_still_matches(
    session: AgentSession, chat_tok: Any, tools: Any
) -> None:
    _, _, parsed = _turn(session, USER, tools, [*chat_tok.encode(CALL), chat_tok.eos_id])
    messages = _agents_history(parsed)
    messages[1]["tool_calls"][0].pop("id")
    messages[1]["tool_calls"][0]["function"]["arguments"] = '{ "key" : "4821" }'
    messages[1]["content"] = ""
    messages[2]["tool_call_id"] = "regenerated"
    plan = session.prompt(messages, tools)
    assert not plan.prefix_break
    # dict arguments and content parts are read by meaning too
    messages[1]["tool_calls"][0]["function"]["arguments"] = {"key": "4821"}
    messages[0] = {"role": "user", "content": [{"type": "text", "text": USER[0]["content"]}]}
    assert not session.prompt(messages, tools).prefix_break


def test_sampled_ids_stay_verbatim_when_reencoding_differs(
    session: AgentSession, chat_tok: Any, tools: Any
) -> None:
    raw = chat_tok.raw
    odd = [raw.convert_tokens_to_ids(c) for c in "the"]  # "the" encodes as "th" + "e"
    ids1 = odd + chat_tok.encode(" key") + [chat_tok.eos_id]
    assert chat_tok.encode(chat_tok.decode(ids1, skip_special_tokens=False)) != ids1
    plan1, _turn1, parsed = _turn(session, USER, tools, ids1)
    assert parsed.message.content == "the key"
    messages = [*USER, {"role": "assistant", "content": "the key"}, USER[0]]
    plan2 = session.prompt(messages, tools)
    assert not plan2.prefix_break
    start = len(plan1.prompt_ids)
    assert plan2.prompt_ids[start : start + len(ids1)] == ids1
    # the re-encoded conversation differs: the session did not re-tokenize
    assert plan2.prompt_ids != chat_tok.encode(chat_tok.render(messages, tools))


@pytest.mark.parametrize("edit", ["arguments", "user", "tools", "dropped", "retry", "role"])
def test_edited_history_starts_a_new_segment(
    session: AgentSession, chat_tok: Any, tools: Any, edit: str
) -> None:
    _, _, parsed = _turn(session, USER, tools, [*chat_tok.encode(CALL), chat_tok.eos_id])
    messages = _agents_history(parsed)
    sent_tools = copy.deepcopy(tools)
    if edit == "arguments":
        messages[1]["tool_calls"][0]["function"]["arguments"] = '{"key":"4822"}'
    elif edit == "user":
        messages[0] = {"role": "user", "content": "value of key 4822?"}
    elif edit == "tools":
        sent_tools[0]["function"]["description"] = "changed"
    elif edit == "dropped":
        messages = [messages[0], messages[2]]
    elif edit == "retry":
        messages = list(USER)
    elif edit == "role":
        messages[0] = {"role": "system", "content": USER[0]["content"]}
    plan = session.prompt(messages, sent_tools)
    assert plan.prefix_break and plan.segment == 1 and plan.reused == 0
    assert plan.break_reason
    assert plan.prompt_ids == chat_tok.encode(chat_tok.render(messages, sent_tools))
    ids = [*chat_tok.encode("ok"), chat_tok.eos_id]
    turn, _ = session.record(plan, messages, sent_tools, ids, _log_probs(ids))
    assert (turn.segment, turn.prefix_break) == (1, True)
    # the new segment continues token-faithfully from its own first turn
    follow = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "1"}]
    after = session.prompt(follow, sent_tools)
    assert (after.segment, after.prefix_break) == (1, False)
    assert after.prompt_ids[: after.reused] == turn.prompt_ids + turn.completion_ids


def test_length_stopped_completion_gets_one_eos_before_the_bridge(
    session: AgentSession, chat_tok: Any, tools: Any
) -> None:
    ids1 = chat_tok.encode("The value is 12")  # cut by max_tokens: no eos
    plan1, turn1, parsed = _turn(session, USER, tools, ids1, finish_reason="length")
    assert turn1.finish_reason == "length"
    messages = [
        *USER,
        {"role": "assistant", "content": parsed.message.content},
        {"role": "user", "content": "again"},
    ]
    plan2 = session.prompt(messages, tools)
    assert not plan2.prefix_break and plan2.appended_eos
    end = len(plan1.prompt_ids) + len(ids1)
    assert plan2.prompt_ids[:end] == plan1.prompt_ids + ids1
    assert plan2.prompt_ids[end] == chat_tok.eos_id
    assert chat_tok.decode(plan2.prompt_ids[end:], skip_special_tokens=False) == (
        "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    turn2, _ = session.record(plan2, messages, tools, [chat_tok.eos_id], [-0.5])
    assert turn2.appended_eos


def test_pydantic_messages_are_read_like_dicts(chat_tok: Any, tools: Any) -> None:
    from pydantic import BaseModel

    class Message(BaseModel):
        role: str
        content: str | None = None

    session = AgentSession(_session(), chat_tok)
    plan = session.prompt([Message(**USER[0])], tools)
    assert plan.prompt_ids == chat_tok.encode(chat_tok.render(USER, tools))


def test_turn_requires_one_log_prob_per_id(session: AgentSession, chat_tok: Any) -> None:
    plan = session.prompt(USER)
    with pytest.raises(ValueError, match="log-probs"):
        session.record(plan, USER, None, [5, 6, chat_tok.eos_id], [-1.0])
    assert session.state.turns == []
