"""openai-agents 0.24 as the black-box client of agent sessions (issue 26): an ``Agent`` with a
strict function tool and ``tool_choice="required"`` runs through ``Runner.run`` and
``Runner.run_streamed`` against session URLs on the real tiny ChatML model (vLLM on CPU).

An agent with an ``output_type`` gets its final answer as JSON of that type (``response_format``
constrains the free turn; the forced call wins on turn 1).

Turn 1 is forced to one call by constrained decoding; openai-agents then resets tool_choice, so
turn 2 is the random model's free text (bounded by ``max_tokens``) and the run ends there. The
trajectory each run leaves is checked token by token: turn 2's prompt begins with turn 1's
prompt and sampled ids, and the loss mask is 1 exactly on the sampled ids.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest

pytestmark = pytest.mark.slow

agents = pytest.importorskip("agents")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

MAX_TOKENS = 400
PLAIN_RUNS = 4
STREAMED_RUNS = 2


@pytest.fixture
def rl(agents_rl: Any) -> Any:
    """The folder's shared server (``conftest.agents_rl``)."""
    return agents_rl


@pytest.fixture(autouse=True)
def no_tracing(monkeypatch):
    """openai-agents posts traces to api.openai.com unless tracing is off."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    agents.set_tracing_disabled(True)


class Tee(httpx.AsyncBaseTransport):
    """A loopback transport that keeps each response body (to see the SSE stream's end)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: Any) -> Any:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        await response.aclose()
        self.bodies.append(body)
        headers = [
            (k, v)
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


calls: list[str] = []


@agents.function_tool
def lookup(key: str) -> str:
    """Look up the value stored under a key."""
    calls.append(key)
    return "7310"


def _agent(handle: Any, tee: Tee) -> Any:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        base_url=handle.base_url,
        api_key=handle.api_key,
        max_retries=0,
        http_client=httpx.AsyncClient(transport=tee, timeout=600, trust_env=False),
    )
    model = agents.OpenAIChatCompletionsModel(model=handle.model, openai_client=client)
    settings = agents.ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, temperature=1.0)
    return agents.Agent(
        name="lookup-agent",
        instructions="Answer with the value the lookup tool returns.",
        tools=[lookup],
        model=model,
        model_settings=settings,
    )


async def _plain(handle: Any, tee: Tee) -> Any:
    return await agents.Runner.run(_agent(handle, tee), "value of key 4821?", max_turns=3)


async def _streamed(handle: Any, tee: Tee) -> tuple[Any, list[Any]]:
    result = agents.Runner.run_streamed(_agent(handle, tee), "value of key 4821?", max_turns=3)
    events = [event async for event in result.stream_events()]
    return result, events


def _check_trajectory(rl: Any, session_id: str) -> None:
    """Turn 1 is a schema-valid forced call; turn 2 extends it token for token."""
    trajectory = rl.session_trajectory(session_id)
    turn1, turn2 = trajectory["turns"]
    assert turn1["finish_reason"] == "tool_calls"
    (call,) = turn1["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    jsonschema.validate(json.loads(call["function"]["arguments"]), lookup.params_json_schema)
    assert lookup.params_json_schema["additionalProperties"] is False
    assert turn2["finish_reason"] in ("stop", "length", "tool_calls")
    head = turn1["prompt_ids"] + turn1["completion_ids"]
    assert turn2["prompt_ids"][: len(head)] == head
    assert turn2["prefix_break"] is False and turn2["segment"] == 0
    for turn in (turn1, turn2):
        assert len(turn["completion_log_probs"]) == len(turn["completion_ids"])
    (row,) = trajectory["rows"]
    assert row["input_ids"] == turn2["prompt_ids"] + turn2["completion_ids"]
    start1, start2 = len(turn1["prompt_ids"]), len(turn2["prompt_ids"])
    sampled = set(range(start1, start1 + len(turn1["completion_ids"])))
    sampled |= set(range(start2, start2 + len(turn2["completion_ids"])))
    assert {i for i, m in enumerate(row["loss_mask"]) if m == 1.0} == sampled
    assert [row["rollout_log_probs"][i] for i in sorted(sampled)] == (
        turn1["completion_log_probs"] + turn2["completion_log_probs"]
    )


def test_runner_run_with_a_required_tool_finishes_and_is_token_faithful(rl):
    handles = [rl.open_session(ttl=900) for _ in range(PLAIN_RUNS)]
    tees = [Tee() for _ in handles]
    calls.clear()

    async def main() -> list[Any]:
        return await asyncio.gather(*(_plain(h, t) for h, t in zip(handles, tees, strict=True)))

    results = asyncio.run(main())
    assert len(calls) == PLAIN_RUNS  # the tool ran once per run
    for handle, result in zip(handles, results, strict=True):
        assert isinstance(result.final_output, str)
        _check_trajectory(rl, handle.session_id)
        rl.close_session(handle.session_id)


def test_runner_run_streamed_yields_tool_call_deltas_and_done(rl):
    from openai.types.responses import (
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseOutputItemAddedEvent,
    )

    handles = [rl.open_session(ttl=900) for _ in range(STREAMED_RUNS)]
    tees = [Tee() for _ in handles]

    async def main() -> list[tuple[Any, list[Any]]]:
        runs = (_streamed(h, t) for h, t in zip(handles, tees, strict=True))
        return await asyncio.gather(*runs)

    for handle, tee, (result, events) in zip(handles, tees, asyncio.run(main()), strict=True):
        assert result.is_complete and isinstance(result.final_output, str)
        raw = [e.data for e in events if e.type == "raw_response_event"]
        added = [
            e.item.name
            for e in raw
            if isinstance(e, ResponseOutputItemAddedEvent) and e.item.type == "function_call"
        ]
        assert added == ["lookup"]
        assert any(isinstance(e, ResponseFunctionCallArgumentsDeltaEvent) for e in raw)
        assert any(e.type == "run_item_stream_event" and e.name == "tool_output" for e in events)
        streams = [b for b in tee.bodies if b.startswith(b"data: ")]
        assert len(streams) == 2  # one streamed answer per turn
        for body in streams:
            assert body.rstrip().endswith(b"data: [DONE]")
            first = json.loads(body.split(b"\n\n")[0][len(b"data: ") :])
            assert first["object"] == "chat.completion.chunk"
        tool_deltas = [
            line
            for line in streams[0].split(b"\n\n")
            if b'"tool_calls"' in line and b'"arguments"' in line
        ]
        assert len(tool_deltas) == 1
        _check_trajectory(rl, handle.session_id)
        rl.close_session(handle.session_id)


class Verdict(pydantic.BaseModel):
    """The structured final answer of the output-type agent."""

    answer: Literal["yes", "no"]


def test_an_agent_with_an_output_type_ends_with_json_of_that_type(rl):
    handle = rl.open_session(ttl=900)
    tee = Tee()
    agent = _agent(handle, tee).clone(output_type=Verdict)
    result = asyncio.run(agents.Runner.run(agent, "is key 4821 stored?", max_turns=3))
    assert isinstance(result.final_output, Verdict)
    turns = rl.session_trajectory(handle.session_id)["turns"]
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "stop"]
    answers = [json.loads(body) for body in tee.bodies]
    assert Verdict.model_validate_json(answers[-1]["choices"][0]["message"]["content"])
    assert turns[1]["prefix_break"] is False
    rl.close_session(handle.session_id)
