"""``tool_choice="required"`` and a named tool enforced by constrained decoding on the real
tiny ChatML model (vLLM on CPU, through a session URL with the ``openai`` client): every sample
at temperature 1 is one parseable call with schema-valid arguments, made only of sampled ids
with their log-probs; an unknown tool or a schema that cannot compile is a 400, after which
the session keeps answering."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.openai_errors import refused

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

PARAMETERS = {
    "type": "object",
    "properties": {"key": {"type": "string"}},
    "required": ["key"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "function",
    "function": {"name": "lookup", "parameters": PARAMETERS, "strict": True},
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "clock",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "strict": True,
    },
}
SAMPLES = 8
MAX_TOKENS = 400


@pytest.fixture
def rl(agents_rl: Any) -> Any:
    """The folder's shared server (``conftest.agents_rl``)."""
    return agents_rl


def _turn(handle: Any, tool_choice: Any, tools: list[dict[str, Any]]) -> Any:
    client = openai.OpenAI(base_url=handle.base_url, api_key=handle.api_key, max_retries=0)
    return client.chat.completions.create(
        model=handle.model,
        messages=[{"role": "user", "content": "value of key 4821?"}],
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        logprobs=True,
        extra_body={"return_token_ids": True},
        timeout=300,
    )


def test_required_gives_one_valid_call_in_every_sample(rl):
    handles = [rl.open_session(ttl=600) for _ in range(SAMPLES)]
    with ThreadPoolExecutor(SAMPLES) as pool:
        answers = list(pool.map(lambda h: _turn(h, "required", [LOOKUP, CLOCK]), handles))
    valid = 0
    for handle, answer in zip(handles, answers, strict=True):
        choice = answer.choices[0]
        ids = choice.model_extra["token_ids"]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        schema = PARAMETERS if call.function.name == "lookup" else CLOCK["function"]["parameters"]
        jsonschema.validate(arguments, schema)
        valid += 1
        assert [c.model_extra["token_id"] for c in choice.logprobs.content] == ids
        assert all(c.logprob > -1e9 for c in choice.logprobs.content)
        (turn,) = rl.session_trajectory(handle.session_id)["turns"]
        assert turn["completion_ids"] == ids and turn["completion_ids"][0] == 4
        assert len(turn["completion_log_probs"]) == len(ids)
        rl.close_session(handle.session_id)
    assert valid == SAMPLES


def test_a_named_tool_is_called_and_bad_choices_are_400(rl):
    handle = rl.open_session(ttl=600)
    named = {"type": "function", "function": {"name": "clock"}}
    answer = _turn(handle, named, [LOOKUP, CLOCK])
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "clock" and json.loads(call.function.arguments) == {}
    nowhere = {"type": "function", "function": {"name": "nowhere"}}
    refused(lambda: _turn(handle, nowhere, [LOOKUP]), 400, "nowhere")
    broken = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"key": {"type": "nonsense"}}},
        },
    }
    refused(lambda: _turn(handle, "required", [broken]))
    again = _turn(handle, "required", [LOOKUP])
    assert again.choices[0].finish_reason == "tool_calls"
