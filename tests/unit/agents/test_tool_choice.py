"""``tool_choice`` as constrained decoding: which tools a turn must call, the structural tag
that forces one Hermes call (checked with xgrammar's matcher on the tiny ChatML tokenizer),
and the engine's ``structured_outputs`` sampling param."""

from __future__ import annotations

import json

import pytest
from support.grammar import accepts, tag_matcher

from arctic_platform.rl.agents.tool_choice import call_schema, forced_tools, tool_call_constraint
from arctic_platform.rl.errors import BadRequestError


def test_free_choices_force_nothing_and_bad_ones_are_400(tools):
    assert forced_tools(None, tools) is None
    assert forced_tools("auto", tools) is None
    assert forced_tools("none", None) is None
    assert [f["name"] for f in forced_tools("required", tools)] == ["lookup"]
    named = {"type": "function", "function": {"name": "lookup"}}
    assert forced_tools(named, tools) == [tools[0]["function"]]
    with pytest.raises(BadRequestError, match="at least one tool"):
        forced_tools("required", [])
    with pytest.raises(BadRequestError, match="'missing'"):
        forced_tools({"type": "function", "function": {"name": "missing"}}, tools)
    with pytest.raises(BadRequestError, match="not supported"):
        forced_tools("sometimes", tools)
    with pytest.raises(BadRequestError, match="tools\\[0\\]"):
        forced_tools("required", [{"type": "function", "function": {}}])


def test_the_call_schema_names_each_tool_once():
    one = call_schema([{"name": "a"}])
    assert one["properties"]["name"] == {"const": "a"}
    assert one["properties"]["arguments"] == {"type": "object", "properties": {}}
    assert one["additionalProperties"] is False
    two = call_schema([{"name": "a"}, {"name": "b", "parameters": {"type": "object"}}])
    assert [o["properties"]["name"]["const"] for o in two["anyOf"]] == ["a", "b"]


def test_the_structural_tag_accepts_exactly_one_call_of_an_allowed_tool(chat_tok, tools):
    constraint = tool_call_constraint(forced_tools("required", tools), chat_tok)
    start, end = chat_tok.token_id("<tool_call>"), chat_tok.token_id("</tool_call>")
    good = chat_tok.encode('{"name": "lookup", "arguments": {"key": "4821"}}')
    matcher = tag_matcher(chat_tok, constraint)
    assert accepts(matcher, [start, *good, end, chat_tok.eos_id])
    assert matcher.is_terminated()
    text_first = tag_matcher(chat_tok, constraint)
    assert not text_first.accept_token(chat_tok.encode("hi")[0])  # the call comes first
    for wrong in (
        '{"name": "other", "arguments": {"key": "1"}}',
        '{"name": "lookup", "arguments": {"key": "1", "extra": 2}}',
        '{"name": "lookup", "arguments": {"key": 1}}',
    ):
        assert not accepts(tag_matcher(chat_tok, constraint), [start, *chat_tok.encode(wrong)])
    inside = chat_tok.encode('{"name": "lookup", "arguments": {"key": "')
    matcher = tag_matcher(chat_tok, constraint)
    assert accepts(matcher, [start, *inside])
    assert not matcher.accept_token(chat_tok.eos_id)  # no control token inside a string
    assert not tag_matcher(chat_tok, constraint).accept_token(end)


def test_a_tokenizer_without_call_tokens_cannot_force_a_call(tools):
    class Plain:
        raw = None

        def token_id(self, text: str) -> int | None:
            return None

    with pytest.raises(BadRequestError, match="tool_call"):
        tool_call_constraint(forced_tools("required", tools), Plain())  # type: ignore[arg-type]


def test_the_engine_takes_structured_outputs_over_the_wire():
    sampling = pytest.importorskip("arctic_rl_engines.vllm_sampling")
    spec = sampling.SamplingSpec.parse(
        {"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": True}}
    )
    assert spec.structured_outputs == {"json": '{"type": "object"}', "disable_any_whitespace": True}
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}
    parsed = sampling.SamplingSpec.parse({"structured_outputs": {"structural_tag": tag}})
    assert json.loads(parsed.structured_outputs["structural_tag"]) == tag
    assert sampling.SamplingSpec.parse({}).structured_outputs is None
    for bad in (
        "json",
        {},
        {"json": {}, "regex": "a"},
        {"json": "{not json"},
        {"json": [1]},
        {"regex": ""},
        {"choice": []},
        {"json_object": False},
        {"structural_tag": {"format": {}}},
        {"json": {}, "colour": "red"},
        {"regex": "a", "disable_any_whitespace": "yes"},
    ):
        with pytest.raises(ValueError, match="structured_outputs"):
            sampling.SamplingSpec.parse({"structured_outputs": bad})
