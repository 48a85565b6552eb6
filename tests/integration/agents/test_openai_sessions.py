"""Agent sessions on a real local server over http, driven by the real ``openai`` client
(issue 26): a two-turn episode with a tool answered as openai-agents answers it, and the
trajectory it leaves is token-faithful; unknown sessions and malformed messages are OpenAI
errors after which the session still answers.

The folder's shared local-backend server (``conftest.agents_rl``: a sampling job, vLLM on CPU,
and a training job of the tiny ChatML model). The random model seldom emits a real tool call,
so turn 2's history is built from whatever turn 1 returned: the point is token faithfulness,
not the model's skill.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from support.openai_errors import refused
from support.tools import lookup_tool

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")

LOOKUP = lookup_tool()
EXTRA = {"return_token_ids": True}


@pytest.fixture
def rl(agents_rl: Any) -> Any:
    """The folder's shared server (``conftest.agents_rl``)."""
    return agents_rl


def _openai(handle: Any) -> Any:
    assert handle.base_url is not None
    return openai.OpenAI(base_url=handle.base_url, api_key=handle.api_key, max_retries=0)


def _assistant(message: Any) -> dict[str, Any]:
    """Turn 1's answer re-sent as openai-agents does: content None beside tool calls."""
    if message.tool_calls:
        calls = [call.model_dump(exclude_none=True) for call in message.tool_calls]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": message.content or ""}


def test_two_turns_with_a_tool_leave_a_token_faithful_trajectory(rl):
    handle = rl.open_session(ttl=600)
    client = _openai(handle)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "value of key 4821?"}]
    first = client.chat.completions.create(
        model=handle.model,
        messages=messages,
        tools=[LOOKUP],
        max_tokens=24,
        temperature=1.0,
        seed=7,
        logprobs=True,
        extra_body=EXTRA,
    )
    choice1 = first.choices[0]
    ids1 = choice1.model_extra["token_ids"]
    prompt1 = first.model_extra["prompt_token_ids"]
    assert ids1 and len(choice1.logprobs.content) == len(ids1)
    assert [c.model_extra["token_id"] for c in choice1.logprobs.content] == ids1
    assert choice1.model_extra["weight_version_start"] == 0
    call_id = choice1.message.tool_calls[0].id if choice1.message.tool_calls else "call_0"
    messages += [
        _assistant(choice1.message),
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"value": "1234"})},
    ]
    second = client.chat.completions.create(
        model=handle.model, messages=messages, tools=[LOOKUP], max_tokens=16, extra_body=EXTRA
    )
    ids2 = second.choices[0].model_extra["token_ids"]
    prompt2 = second.model_extra["prompt_token_ids"]
    assert prompt2[: len(prompt1) + len(ids1)] == prompt1 + ids1

    trajectory = rl.session_trajectory(handle.session_id)
    turn1, turn2 = trajectory["turns"]
    assert turn1["prompt_ids"] == prompt1 and turn1["completion_ids"] == ids1
    assert turn2["prompt_ids"] == prompt2 and turn2["completion_ids"] == ids2
    assert turn2["prompt_ids"][: len(prompt1) + len(ids1)] == prompt1 + ids1
    assert turn2["prefix_break"] is False and turn2["segment"] == 0
    for turn in (turn1, turn2):
        assert len(turn["completion_log_probs"]) == len(turn["completion_ids"])
        assert turn["weight_version_start"] == turn["weight_version_end"] == 0
    (row,) = trajectory["rows"]
    assert row["input_ids"] == prompt2 + ids2
    sampled = set(range(len(prompt1), len(prompt1) + len(ids1)))
    sampled |= set(range(len(prompt2), len(prompt2) + len(ids2)))
    assert {i for i, m in enumerate(row["loss_mask"]) if m == 1.0} == sampled
    assert [row["rollout_log_probs"][i] for i in sorted(sampled)] == (
        turn1["completion_log_probs"] + turn2["completion_log_probs"]
    )
    assert trajectory["batch"]["input_ids"] == [row["input_ids"]]
    listed = {s["session_id"]: s["turns"] for s in rl.list_sessions()}
    assert listed[handle.session_id] == 2
    assert rl.close_session(handle.session_id)["closed"] is True


def test_bad_requests_are_openai_errors_and_the_session_keeps_answering(rl):
    handle = rl.open_session()
    client = _openai(handle)
    user = [{"role": "user", "content": "hello"}]
    unknown = openai.OpenAI(
        base_url=handle.base_url.replace(handle.session_id, "00000000deadbeef"),
        api_key=handle.api_key,
        max_retries=0,
    )
    refused(
        lambda: unknown.chat.completions.create(model=handle.model, messages=user, max_tokens=4),
        404,
    )
    refused(
        lambda: client.chat.completions.create(
            model=handle.model, messages=[{"role": "wizard", "content": "x"}], max_tokens=4
        )
    )
    refused(
        lambda: client.chat.completions.create(
            model=handle.model, messages=[{"role": "user", "content": "7 " * 5000}], max_tokens=4
        )
    )
    answer = client.chat.completions.create(model=handle.model, messages=user, max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    models = client.models.list().data
    assert models[0].id == handle.model and models[0].model_extra["max_model_len"] > 0
    rl.close_session(handle.session_id)
    refused(
        lambda: client.chat.completions.create(model=handle.model, messages=user, max_tokens=4),
        404,
    )


def test_token_in_generate_records_its_turns(rl):
    handle = rl.open_session()
    import httpx

    url = handle.base_url.removesuffix("/v1") + "/inference/v1/generate"
    headers = {"Authorization": f"Bearer {handle.api_key}"}
    prompt = [1, 20, 21, 22, 2]
    body = {"model": handle.model, "token_ids": prompt, "sampling_params": {"max_tokens": 6}}
    answer = httpx.post(url, json=body, headers=headers, timeout=120, trust_env=False).json()
    choice = answer["choices"][0]
    ids = choice["token_ids"]
    assert [c["token"] for c in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]
    assert all(c["logprob"] > -9999 for c in choice["logprobs"]["content"])
    (turn,) = rl.session_trajectory(handle.session_id)["turns"]
    assert turn["prompt_ids"] == prompt and turn["completion_ids"] == ids


def test_completions_with_text_then_ids_are_one_token_faithful_segment(rl):
    handle = rl.open_session()
    client = _openai(handle)
    first = client.completions.create(
        model=handle.model, prompt="lookup 4821", max_tokens=6, temperature=1.0, seed=5,
        logprobs=1, extra_body=EXTRA,
    )  # fmt: skip
    choice = first.choices[0]
    prompt, ids = choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
    assert len(choice.logprobs.token_logprobs) == len(ids) > 0
    second = client.completions.create(
        model=handle.model, prompt=[*prompt, *ids, 20], max_tokens=4, extra_body=EXTRA
    )
    assert second.choices[0].model_extra["prompt_token_ids"] == [*prompt, *ids, 20]
    turns = rl.session_trajectory(handle.session_id)["turns"]
    assert [t["completion_ids"] for t in turns] == [ids, second.choices[0].model_extra["token_ids"]]
    assert turns[0]["completion_log_probs"] == choice.logprobs.token_logprobs
    assert [t["segment"] for t in turns] == [0, 0] and not turns[1]["prefix_break"]
    refused(
        lambda: client.completions.create(model=handle.model, prompt="x", best_of=2), 400, "best_of"
    )
    # n choices of one request: sibling turns, one row each when none is continued
    several = client.chat.completions.create(
        model=handle.model, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=4,
        temperature=1.0, seed=7, extra_body=EXTRA,
    )  # fmt: skip
    assert [c.index for c in several.choices] == [0, 1, 2]
    turns = rl.session_trajectory(handle.session_id)["turns"][-3:]
    assert [t["completion_ids"] for t in turns] == [
        c.model_extra["token_ids"] for c in several.choices
    ]
    assert len({tuple(t["prompt_ids"]) for t in turns}) == 1


def _turn(client: Any, handle: Any, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model=handle.model,
        messages=messages,
        max_tokens=8,
        temperature=1.0,
        seed=3,
        extra_body=EXTRA,
    )


def test_a_weight_sync_between_two_turns_shows_in_the_trajectory_and_ends_a_strict_session(rl):
    """Moves the shared sampler to a new weight version (versions are compared relative)."""
    handle, strict = rl.open_session(ttl=600), rl.open_session(ttl=600, max_staleness=0)
    client, strict_client = _openai(handle), _openai(strict)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "value of key 4821?"}]
    first = _turn(client, handle, messages)
    _turn(strict_client, strict, messages)
    ids = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    rl.fwd_bwd({"input_ids": [ids], "loss_mask": [[0.0] + [1.0] * (len(ids) - 1)]}, "cross_entropy")
    rl.step()
    version = rl.sync_weights()["weight_version"]
    assert version >= 1
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "and now?"},
    ]
    second = _turn(client, handle, messages)
    assert second.choices[0].model_extra["weight_version_start"] == version
    turns = rl.session_trajectory(handle.session_id)["turns"]
    assert [(t["weight_version_start"], t["weight_version_end"]) for t in turns] == [
        (version - 1, version - 1),
        (version, version),
    ]
    assert turns[1]["prefix_break"] is False  # the new weights do not break the token prefix
    refused(lambda: _turn(strict_client, strict, messages), 400, "max_staleness")
    assert _turn(client, handle, [{"role": "user", "content": "still here?"}]).choices


def test_over_the_ray_transport_the_routes_are_http_beside_the_server_actor(rl):
    """The client speaks ray (no HTTP address of its own); the session's base URL is where the
    server actor serves the routes, with the header and API-key carriers too."""
    import httpx

    assert rl.config.comm_protocol == "ray" and not hasattr(rl.transport, "base_url")
    handle = rl.open_session()
    assert handle.base_url is not None and handle.base_url.startswith("http://127.0.0.1:")
    root = handle.base_url.removesuffix(handle.base_url_path)
    assert httpx.get(root + "/health", trust_env=False).json() == {"ok": True}
    user = [{"role": "user", "content": "hello"}]
    by_key = openai.OpenAI(base_url=root + "/v1", api_key=handle.api_key, max_retries=0)
    first = by_key.chat.completions.create(model=handle.model, messages=user, max_tokens=4)
    by_header = openai.OpenAI(
        base_url=root + "/v1",
        api_key="unused",
        default_headers={"X-Session-ID": handle.session_id},
        max_retries=0,
    )
    refused(  # the server has a token: a wrong key fails
        lambda: by_header.chat.completions.create(model=handle.model, messages=user, max_tokens=4),
        401,
    )
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert len(rl.session_trajectory(handle.session_id)["turns"]) == 1
    assert handle.session_id in {s["session_id"] for s in rl.list_sessions()}
    rl.close_session(handle.session_id)


def test_malformed_inputs_are_openai_400s_on_the_real_server_and_it_keeps_answering(rl):
    """Issue 33 item 4 through the real server: tools that are not named functions with a
    JSON schema (tool_choice auto), a seed past 64 bits, a 5 MB message (refused before it is
    tokenized), max_tokens past the context; each an OpenAI 400, the session answering after."""
    handle = rl.open_session()
    client = _openai(handle)
    user = [{"role": "user", "content": "hi"}]
    bad_tools = [
        {"type": "function", "function": {"parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "f", "parameters": "an object"}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}},
    ]
    requests: list[dict[str, Any]] = [
        {"messages": user, "tools": [tool], "tool_choice": "auto"} for tool in bad_tools
    ]
    requests += [
        {"messages": user, "seed": 2**64},
        {"messages": [{"role": "user", "content": "7 " * 2_500_000}]},
        {"messages": user, "max_tokens": 10**6},
    ]
    for request in requests:
        started = time.perf_counter()
        refused(
            lambda r=request: client.chat.completions.create(
                model=handle.model, **{"max_tokens": 4, **r}
            )
        )
        size = len(json.dumps(request))
        print(f"{size} B request: 400 in {time.perf_counter() - started:.3f} s")
    answer = client.chat.completions.create(model=handle.model, messages=user, max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert len(rl.session_trajectory(handle.session_id)["turns"]) == 1
    rl.close_session(handle.session_id)


def test_twenty_concurrent_requests_on_one_session_keep_each_conversation_in_its_segment(rl):
    """Ten two-turn conversations at once on one session (20 requests in flight together):
    each conversation's second turn continues its own first turn's ids, in its segment."""
    from concurrent.futures import ThreadPoolExecutor

    handle = rl.open_session(ttl=600)
    client = _openai(handle)

    def talk(number: int) -> tuple[list[int], list[int], list[int]]:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"conversation {number}: the key {number * 1111}"}
        ]
        first = client.chat.completions.create(
            model=handle.model, messages=messages, max_tokens=6, temperature=1.0,
            seed=number, extra_body=EXTRA,
        )  # fmt: skip
        messages += [_assistant(first.choices[0].message), {"role": "user", "content": "and?"}]
        second = client.chat.completions.create(
            model=handle.model, messages=messages, max_tokens=6, extra_body=EXTRA
        )
        return (
            first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"],
            second.model_extra["prompt_token_ids"],
            second.choices[0].model_extra["token_ids"],
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        talks = list(pool.map(talk, range(10)))
    trajectory = rl.session_trajectory(handle.session_id)
    turns = trajectory["turns"]
    assert len(turns) == 20
    segments = {}
    for head, prompt2, _ in talks:
        assert prompt2[: len(head)] == head  # turn 2 extends exactly its own turn 1
        (second,) = [t for t in turns if t["prompt_ids"] == prompt2]
        first = turns[second["parent"]]
        assert first["prompt_ids"] + first["completion_ids"] == head
        assert second["segment"] == first["segment"] and not second["prefix_break"]
        segments[second["segment"]] = head
    assert len(segments) == 10  # one segment per conversation
    assert len(trajectory["rows"]) == 10
    rl.close_session(handle.session_id)
