"""The tiny ChatML tool-calling tokenizer of ``arctic_platform.rl.testing``: single-id specials,
one id per digit, a Hermes/Qwen-style template whose earlier turns are never rewritten (each
sampled assistant turn is a token prefix of the next rendering), and the unchanged "plain" one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from support.tools import lookup_tool

from arctic_platform.rl.testing import (
    CHAT_TEMPLATE,
    CHATML_CONTROL_TOKENS,
    CHATML_SPECIAL_TOKENS,
    CHATML_TEXT_TAGS,
    IM_END,
    SPECIAL_TOKENS,
    TOOL_CALL_END,
    TOOL_CALL_START,
    build_tiny_model,
    build_tokenizer,
)

pytest.importorskip("transformers")

TOOLS = [lookup_tool(strict=False, closed=False)]


def _call(call_id: str, key: str, as_string: bool = True) -> dict[str, Any]:
    arguments: Any = json.dumps({"key": key}) if as_string else {"key": key}
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }


# system, user, assistant(tool call, null content), tool, assistant(text), user,
# assistant(two calls, one with dict arguments), tool, tool, assistant(think + text)
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer with the digits only."},
    {"role": "user", "content": "What is stored under 4821?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1", "4821")]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"value": "93"}'},
    {"role": "assistant", "content": "93"},
    {"role": "user", "content": "And under 7 and 12, together?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("c2", "7"), _call("c3", "12", as_string=False)],
    },
    {"role": "tool", "tool_call_id": "c2", "content": '{"value": "5"}'},
    {"role": "tool", "tool_call_id": "c3", "content": '{"value": "40"}'},
    {"role": "assistant", "content": "<think>\n5 plus 40\n</think>\n\nThe sum is 45"},
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default-size ChatML tokenizer, trained once for this module."""
    from transformers import AutoTokenizer

    path = build_tokenizer(tmp_path_factory.mktemp("chatml"), chat_format="chatml")
    return AutoTokenizer.from_pretrained(str(path))


def _ids(tok: Any, messages: list[dict[str, Any]], generation_prompt: bool = False) -> list[int]:
    out = tok.apply_chat_template(
        messages,
        tools=TOOLS,
        tokenize=True,
        add_generation_prompt=generation_prompt,
        return_dict=False,
    )
    return list(out)


def _text(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(tok.apply_chat_template(messages, tokenize=False, **kwargs))


def _sampled_text(message: dict[str, Any]) -> str:
    """What a model would emit for ``message`` (built by hand, not by the template)."""
    calls = []
    for call in message.get("tool_calls") or []:
        args = call["function"]["arguments"]
        args = args if isinstance(args, str) else json.dumps(args)
        name = call["function"]["name"]
        calls.append(f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>')
    return "\n".join(([message["content"]] if message["content"] else []) + calls)


def test_round_trip_keeps_text_and_tags(tok: Any) -> None:
    texts = [
        "What is stored under 4821?",
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>',
        "<think>\nhm\n</think>\n\nünïcode ✓ 12 + 34 = 46",
        "<|im_start|>user\nhi<|im_end|>\n",
    ]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    # the tags stay in the text a tool parser reads; the control tokens do not
    ids = tok.encode("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


def test_each_special_is_one_id(tok: Any) -> None:
    for expected_id, token in enumerate(CHATML_SPECIAL_TOKENS):
        assert tok.encode(token, add_special_tokens=False) == [expected_id]
        assert expected_id in tok.encode(f"a{token}b", add_special_tokens=False)
    assert set(CHATML_CONTROL_TOKENS) <= set(tok.all_special_tokens)
    assert not set(CHATML_TEXT_TAGS) & set(tok.all_special_tokens)
    assert tok.eos_token == IM_END and tok.pad_token == "<|pad|>" and tok.bos_token is None
    assert tok.encode("hello", add_special_tokens=True) == tok.encode(
        "hello", add_special_tokens=False
    )


def test_digits_are_one_id_each_and_tool_calls_are_compact(tok: Any) -> None:
    for text in ["4821", "x 0123456789", '{"key": "4821"}']:
        ids = tok.encode(text, add_special_tokens=False)
        digits = [tok.decode([i]) for i in ids if tok.decode([i]).strip().isdigit()]
        assert "".join(d.strip() for d in digits) == "".join(c for c in text if c.isdigit())
        assert all(len(d.strip()) == 1 for d in digits)
    call = '{"name": "lookup", "arguments": {"key": "4821"}}'
    pieces = [tok.decode([i]) for i in tok.encode(call, add_special_tokens=False)]
    assert {"name", "lookup", "arguments", "key"} <= {p.strip(' "') for p in pieces}
    assert len(pieces) <= 24


def test_template_renders_tools_null_content_calls_and_tool_results(tok: Any) -> None:
    text = _text(tok, CONVERSATION[:5], tools=TOOLS)
    head, _, rest = text.partition("<|im_end|>\n")
    assert head.startswith("<|im_start|>system\nAnswer with the digits only.\n\n")
    assert "\n<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>\n" in head
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json>}\n</tool_call>' in head
    assert rest == (
        "<|im_start|>user\nWhat is stored under 4821?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"value": "93"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n93<|im_end|>\n"
    )
    # two consecutive tool results share one user turn; string and dict arguments match
    tail = _text(tok, CONVERSATION[6:9])
    assert tail == (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "7"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "12"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n"
        '<tool_response>\n{"value": "5"}\n</tool_response>\n'
        '<tool_response>\n{"value": "40"}\n</tool_response><|im_end|>\n'
    )
    # no tools: the system message is an ordinary turn; the generation prompt opens a turn
    plain = _text(tok, CONVERSATION[:2], add_generation_prompt=True)
    assert plain == (
        "<|im_start|>system\nAnswer with the digits only.<|im_end|>\n"
        "<|im_start|>user\nWhat is stored under 4821?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_tolerates_null_and_missing_fields(tok: Any) -> None:
    odd: list[dict[str, Any]] = [
        {"role": "system", "content": None},
        {"content": "no role"},
        {"role": "assistant", "content": "text first", "tool_calls": [{}, {"function": {}}]},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "tool"},
        {"role": "user", "content": [{"type": "text", "text": "parts are not rendered"}]},
    ]
    text = _text(tok, odd, tools=TOOLS, add_generation_prompt=True)
    assert "None" not in text
    assert 'text first\n<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_sampled_assistant_turn_is_a_token_prefix_of_the_next_rendering(tok: Any) -> None:
    eos = tok.convert_tokens_to_ids(IM_END)
    checked = 0
    for k, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = _ids(tok, CONVERSATION[:k], generation_prompt=True)
        sampled = [*tok.encode(_sampled_text(message), add_special_tokens=False), eos]
        longer = _ids(tok, CONVERSATION[: k + 2])
        assert longer[: len(prompt) + len(sampled)] == prompt + sampled, k
        # the generation prompt only appends to the rendering of the earlier turns
        earlier = _ids(tok, CONVERSATION[:k])
        assert prompt[: len(earlier)] == earlier
        checked += 1
    assert checked == 4


def test_chatml_model_stops_at_im_end(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = build_tiny_model(
        tmp_path / "chat", hidden_size=32, num_layers=1, num_heads=2, chat_format="chatml"
    )
    tok = AutoTokenizer.from_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((path / "generation_config.json").read_text())
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert im_end == CHATML_SPECIAL_TOKENS.index(IM_END)
    assert config["eos_token_id"] == generation["eos_token_id"] == im_end
    assert config["pad_token_id"] == generation["pad_token_id"] == tok.pad_token_id
    assert config["vocab_size"] == len(tok)
    stamp = json.loads((path / "arctic_rl_tiny_model.json").read_text())
    assert stamp["chat_format"] == "chatml"
    assert (
        build_tiny_model(
            tmp_path / "chat", hidden_size=32, num_layers=1, num_heads=2, chat_format="chatml"
        )
        == path
    )


def test_plain_default_is_unchanged(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tokenizer(tmp_path / "plain")))
    vocab = json.dumps(sorted(tok.get_vocab().items()))
    # fingerprint of the plain vocabulary as built before the chatml flavour existed
    assert hashlib.sha256(vocab.encode()).hexdigest() == (
        "2a4bd2dcbdadd127d924865c543d0d0fca743e036dbb4d14cd0d2f0ec93bab13"
    )
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(7))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert tok.chat_template == CHAT_TEMPLATE
    assert TOOL_CALL_START not in tok.get_vocab()
    # the stamp of a plain model carries no chat_format key, so old cached models still match
    path = build_tiny_model(tmp_path / "plain-model", hidden_size=32, num_layers=1)
    assert "chat_format" not in json.loads((path / "arctic_rl_tiny_model.json").read_text())
    with pytest.raises(ValueError, match="chat_format"):
        build_tokenizer(tmp_path / "bad", chat_format="xml")  # type: ignore[arg-type]


@pytest.mark.slow
def test_vllm_hermes_parser_reads_a_rendered_tool_call(tok: Any) -> None:
    hermes = pytest.importorskip("vllm.tool_parsers.hermes_tool_parser")
    before = _text(tok, CONVERSATION[:6], tools=TOOLS, add_generation_prompt=True)
    after = _text(tok, CONVERSATION[:7], tools=TOOLS)
    assert after.startswith(before) and after.endswith("<|im_end|>\n")
    turn = after[len(before) : -len("<|im_end|>\n")]
    assert turn.startswith(TOOL_CALL_START) and turn.endswith(TOOL_CALL_END)
    parsed = hermes.Hermes2ProToolParser(tok).extract_tool_calls(turn, None)
    assert parsed.tools_called
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls]
    assert calls == [("lookup", {"key": "7"}), ("lookup", {"key": "12"})]
