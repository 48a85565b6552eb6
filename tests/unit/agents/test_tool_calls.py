"""Hermes/Qwen tool calls parsed from sampled ids: ids cut at the tag ids, only the JSON
between decoded; malformed calls stay content; text around calls is content."""

from __future__ import annotations

import json
from typing import Any

from arctic_platform.rl.agents import parse_completion

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>'


def _parse(tok: Any, text: str, *, eos: bool = True, finish: str = "stop") -> Any:
    ids = tok.encode(text) + ([tok.eos_id] if eos else [])
    return parse_completion(ids, tok, session_id="s9", turn=2, finish_reason=finish)


def test_tag_ids_are_single_tokens(chat_tok: Any) -> None:
    assert chat_tok.token_id("<tool_call>") == 4
    assert chat_tok.token_id("</tool_call>") == 5
    assert chat_tok.eos_id == 3
    assert chat_tok.eos_text == "<|im_end|>"


def test_one_call_from_ids(chat_tok: Any) -> None:
    parsed = _parse(chat_tok, CALL)
    assert parsed.finish_reason == "tool_calls"
    assert parsed.message.content is None
    [call] = parsed.message.tool_calls
    assert call.id == "call_s9_2_0"
    assert call.type == "function"
    assert call.function.name == "lookup"
    assert call.function.arguments == '{"key":"4821"}'  # compact json.dumps
    ids = chat_tok.encode(CALL)
    assert parsed.call_spans == [(0, len(ids))]
    assert parsed.message.to_openai()["tool_calls"][0]["function"]["name"] == "lookup"


def test_text_around_and_two_calls(chat_tok: Any) -> None:
    text = f"Let me look.\n{CALL}\n" + CALL.replace("4821", "7") + "\nDone"
    parsed = _parse(chat_tok, text)
    assert parsed.finish_reason == "tool_calls"
    assert [c.id for c in parsed.message.tool_calls] == ["call_s9_2_0", "call_s9_2_1"]
    args = [json.loads(c.function.arguments) for c in parsed.message.tool_calls]
    assert args == [{"key": "4821"}, {"key": "7"}]
    assert parsed.message.content == "Let me look.\nDone"


def test_arguments_as_a_json_string_are_accepted(chat_tok: Any) -> None:
    text = '<tool_call>\n{"name": "lookup", "arguments": "{\\"key\\": \\"1\\"}"}\n</tool_call>'
    parsed = _parse(chat_tok, text)
    assert parsed.message.tool_calls[0].function.arguments == '{"key":"1"}'


def test_malformed_json_stays_content_and_never_raises(chat_tok: Any) -> None:
    bad = '<tool_call>\n{"name": "lookup", "arguments": {"key": 48\n</tool_call>'
    parsed = _parse(chat_tok, "ok " + bad)
    assert parsed.finish_reason == "stop"
    assert parsed.message.tool_calls is None
    assert parsed.message.content == "ok " + bad
    for text in (
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n["lookup"]\n</tool_call>',  # not an object
        '<tool_call>\n{"name": "lookup", "arguments": 3}\n</tool_call>',
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "1"}}',  # cut by length
    ):
        parsed = _parse(chat_tok, text, eos=False, finish="length")
        assert parsed.message.tool_calls is None
        assert parsed.finish_reason == "length"
        assert parsed.message.content == text


def test_one_good_call_beside_a_malformed_one(chat_tok: Any) -> None:
    bad = "<tool_call>\nnot json\n</tool_call>"
    parsed = _parse(chat_tok, bad + CALL)
    assert len(parsed.message.tool_calls) == 1
    assert parsed.message.tool_calls[0].id == "call_s9_2_0"
    assert parsed.message.content == bad


def test_calls_come_from_tag_ids_not_from_text(chat_tok: Any) -> None:
    # the characters "<tool_call>" sampled one by one decode to the tag's text but are not
    # the tag id: no call is parsed from them
    raw = chat_tok.raw
    spelled = [raw.convert_tokens_to_ids(c) for c in "<tool_call>"]
    assert chat_tok.decode(spelled) == "<tool_call>"
    body = chat_tok.encode('\n{"name": "lookup", "arguments": {}}\n</tool_call>')
    ids = spelled + body + [chat_tok.eos_id]
    parsed = parse_completion(ids, chat_tok, session_id="s", turn=0)
    assert parsed.message.tool_calls is None
    assert parsed.finish_reason == "stop"


def test_plain_text_answer(chat_tok: Any) -> None:
    parsed = _parse(chat_tok, "The value is 1234")
    assert parsed.message.content == "The value is 1234"
    assert parsed.message.tool_calls is None
    assert parsed.finish_reason == "stop"
    empty = parse_completion([chat_tok.eos_id], chat_tok, session_id="s", turn=0)
    assert empty.message.content is None
