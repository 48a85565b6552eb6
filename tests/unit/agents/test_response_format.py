"""``response_format`` as constrained decoding: which schema a format asks for, 400s for the
ones OpenAI does not define, and the structural tag checked with xgrammar's matcher on the tiny
ChatML tokenizer; a chat body turns it into the ``structured_outputs`` sampling param."""

from __future__ import annotations

import pytest
from support.grammar import accepts, tag_matcher

from arctic_platform.rl.agents.openai_api import (
    ChatCompletionBody,
    chat_sampling_params,
    check_chat,
)
from arctic_platform.rl.agents.response_format import response_format_constraint, response_schema
from arctic_platform.rl.errors import BadRequestError

VERDICT = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}


def test_formats_name_their_schema_and_unknown_ones_are_400():
    assert response_schema(None) is None
    assert response_schema({"type": "text"}) is None
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    assert response_schema(AS_SCHEMA) == VERDICT
    assert response_schema({"type": "json_schema", "json_schema": {"name": "x"}}) == {
        "type": "object"
    }
    for bad in (
        "json",
        {"type": "yaml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": [1]}},
    ):
        with pytest.raises(BadRequestError, match="response_format"):
            response_schema(bad)


def test_the_tag_accepts_only_json_of_the_schema_then_eos(chat_tok):
    constraint = response_format_constraint(AS_SCHEMA, chat_tok)
    assert constraint is not None
    matcher = tag_matcher(chat_tok, constraint)
    assert accepts(matcher, [*chat_tok.encode('{"answer": "yes"}'), chat_tok.eos_id])
    assert matcher.is_terminated()
    for wrong in ('{"answer": "maybe"}', '{"answer": "no", "why": 1}', "yes"):
        assert not accepts(tag_matcher(chat_tok, constraint), chat_tok.encode(wrong))
    inside = tag_matcher(chat_tok, constraint)
    assert accepts(inside, chat_tok.encode('{"answer": "'))
    assert not inside.accept_token(chat_tok.eos_id)
    assert response_format_constraint({"type": "text"}, chat_tok) is None


def test_a_chat_body_samples_under_its_format_and_a_forced_call_wins(chat_tok, tools):
    body = ChatCompletionBody.model_validate(
        {"messages": [{"role": "user", "content": "ok?"}], "response_format": AS_SCHEMA}
    )
    check_chat(body)
    params = chat_sampling_params(body, chat_tok, room=64)
    tag = params["structured_outputs"]["structural_tag"]
    assert tag["format"]["json_schema"] == VERDICT
    both = body.model_copy(update={"tools": tools, "tool_choice": "required"})
    check_chat(both)
    forced = chat_sampling_params(both, chat_tok, room=64)["structured_outputs"]
    assert forced["structural_tag"]["format"]["type"] == "sequence"  # the call, not the format
    with pytest.raises(BadRequestError, match="response_format"):
        check_chat(body.model_copy(update={"response_format": {"type": "yaml"}}))
    free = body.model_copy(update={"response_format": {"type": "text"}})
    assert "structured_outputs" not in chat_sampling_params(free, chat_tok, room=64)
