"""Input checks of agent sessions (issue 33 item 4), over the http app with a fake engine:
every bad input is an OpenAI-style 400 before anything is sampled, and the session keeps
answering; concurrent conversations on one session keep their own segments."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from support.openai_errors import openai_error, refused
from support.session_app import TOKEN, FakeServer, http_app, open_session, openai_client

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("jsonschema")

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def tok_dir(chat_tok: Any, tmp_path: Any) -> str:
    chat_tok.raw.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


@pytest.fixture
def session(tok_dir: str) -> tuple[FakeServer, Any]:
    """A fake-engine server and an ``openai`` client on a fresh session of it."""
    server = FakeServer(tok_dir, [])
    http = http_app(server, TOKEN)
    opened = open_session(http)
    return server, openai_client(http, opened["base_url_path"], opened["key"])


def _tool(function: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": function}


BAD_TOOLS = {
    "no function name": _tool({"parameters": {"type": "object"}}),
    "an empty function name": _tool({"name": "", "parameters": {"type": "object"}}),
    "parameters that are a string": _tool({"name": "f", "parameters": "an object"}),
    "parameters that are a list": _tool({"name": "f", "parameters": [{"type": "object"}]}),
    "a schema type that does not exist": _tool(
        {"name": "f", "parameters": {"type": "object", "properties": {"k": {"type": "nonsense"}}}}
    ),
    "required that is not a list": _tool(
        {"name": "f", "parameters": {"type": "object", "required": "k"}}
    ),
}


def _refused(call: Any, match: str | None = None) -> str:
    """The message of the OpenAI 400 (its whole shape checked) that ``call()`` gets."""
    return str(refused(call, 400, match)["message"])


@pytest.mark.parametrize("choice", [None, "auto", "none", "required"])
@pytest.mark.parametrize("name", list(BAD_TOOLS))
def test_a_malformed_tool_is_a_400_whatever_the_tool_choice(session, name, choice):
    server, client = session
    extra = {} if choice is None else {"tool_choice": choice}
    tools = [BAD_TOOLS[name]]
    _refused(lambda: client.chat.completions.create(model="m", messages=USER, tools=tools, **extra))
    assert server.requests == []  # refused before sampling
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message


def test_an_uncompilable_schema_is_a_400_with_the_grammars_reason(session, tools):
    pytest.importorskip("xgrammar")
    _, client = session
    nowhere = {"type": "object", "properties": {"k": {"$ref": "#/$defs/missing"}}}
    bad = [_tool({"name": "f", "parameters": nowhere})]  # a valid schema xgrammar cannot build
    message = _refused(
        lambda: client.chat.completions.create(
            model="m", messages=USER, tools=bad, tool_choice="required"
        ),
        "missing",
    )
    assert "'f'" in message and "triggers" not in message
    form = {"type": "json_schema", "json_schema": {"name": "v", "schema": nowhere}}
    _refused(
        lambda: client.chat.completions.create(model="m", messages=USER, response_format=form),
        "response_format.json_schema.schema",
    )
    # with tool_choice auto nothing is compiled: a valid schema is enough
    assert client.chat.completions.create(model="m", messages=USER, tools=bad).choices


@pytest.mark.parametrize("seed", [2**64, 2**63, -(2**63) - 1])
def test_a_seed_outside_64_bits_is_a_400(session, seed):
    _, client = session
    _refused(lambda: client.chat.completions.create(model="m", messages=USER, seed=seed), "seed")
    _refused(lambda: client.completions.create(model="m", prompt="x", seed=seed), "seed")
    ok = client.chat.completions.create(model="m", messages=USER, seed=2**63 - 1)
    assert ok.choices


def test_a_huge_message_is_refused_without_tokenizing_it(session, monkeypatch):
    """5 MB of text: the 400 comes from a bound on its tokens, not from encoding it."""
    server, client = session
    tokenizer = server.agents._tokenizer(server.jobs.job.config["model_name"])
    encoded: list[int] = []
    real = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: encoded.append(len(text)) or real(text))
    huge = "7 " * 2_500_000
    message = _refused(
        lambda: client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": huge}]
        ),
        "context",
    )
    assert "characters" in message
    _refused(lambda: client.completions.create(model="m", prompt=huge), "context")
    assert max(encoded, default=0) < 10_000, encoded
    assert client.chat.completions.create(model="m", messages=USER).choices


def test_max_tokens_past_the_context_is_a_400_and_within_it_is_kept(session):
    server, client = session  # max_model_len 1024
    _refused(
        lambda: client.chat.completions.create(model="m", messages=USER, max_tokens=5000),
        "max_tokens=5000 does not fit",
    )
    _refused(
        lambda: client.chat.completions.create(
            model="m", messages=USER, max_completion_tokens=1024
        ),
        "max_tokens",
    )
    _refused(lambda: client.completions.create(model="m", prompt="x", max_tokens=1024))
    assert server.requests == []
    client.chat.completions.create(model="m", messages=USER, max_tokens=100)
    assert server.requests[-1].sampling_params["max_tokens"] == 100
    client.chat.completions.create(model="m", messages=USER)  # none asked: the whole room
    room = server.requests[-1].sampling_params["max_tokens"]
    assert 900 < room < 1024


def test_token_in_max_tokens_past_the_context_is_a_400(tok_dir):
    server = FakeServer(tok_dir, [])
    http = http_app(server, None)
    sid = open_session(http, None)["session_id"]
    body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1022}}
    answer = http.post(f"/s/{sid}/inference/v1/generate", json=body)
    assert "does not fit" in openai_error(answer, 400)["message"]
    body["sampling_params"]["max_tokens"] = 1021
    assert http.post(f"/s/{sid}/inference/v1/generate", json=body).status_code == 200
    assert server.requests[-1].sampling_params["max_tokens"] == 1021


CONVERSATIONS = 20


def test_concurrent_conversations_on_one_session_keep_their_own_segments(chat_tok, tok_dir):
    """20 two-turn conversations at once on one session key: each conversation's turns are
    one segment and one trajectory row, however the requests interleave."""
    eos = chat_tok.eos_id
    rng = random.Random(0)
    lock = threading.Lock()

    def reply(prompt: list[int]) -> list[int]:
        with lock:
            pause = rng.uniform(0.0, 0.02)
        time.sleep(pause)  # the engine's timing varies: requests finish out of order
        text = chat_tok.decode(prompt, skip_special_tokens=False)
        number = text.split("conversation ")[1].split(".")[0]
        turn = "two" if "again" in text else "one"
        return [*chat_tok.encode(f"answer {number} {turn}"), eos]

    server = FakeServer(tok_dir, [], reply=reply)
    sid = server.agents.open_session(_open_request())["session_id"]
    start = threading.Barrier(CONVERSATIONS)
    errors: list[BaseException] = []

    def talk(number: int) -> None:
        try:
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": f"conversation {number}."}
            ]
            start.wait()
            first = server.agents.chat_completion(sid, {"messages": messages})
            messages += [
                first["choices"][0]["message"],
                {"role": "user", "content": "again"},
            ]
            server.agents.chat_completion(sid, {"messages": messages})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(CONVERSATIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    trajectory = server.agents.session_trajectory(_session_request(sid))
    turns = trajectory["turns"]
    assert len(turns) == 2 * CONVERSATIONS
    by_segment: dict[int, list[dict[str, Any]]] = {}
    for turn in turns:
        by_segment.setdefault(turn["segment"], []).append(turn)
    assert len(by_segment) == CONVERSATIONS
    for segment in by_segment.values():
        first, second = sorted(segment, key=lambda t: t["index"])
        assert second["parent"] == first["index"] and not second["prefix_break"]
        assert second["prompt_ids"][: len(first["prompt_ids"])] == first["prompt_ids"]
    assert len(trajectory["rows"]) == CONVERSATIONS
    for row in trajectory["rows"]:
        text = chat_tok.decode(row["input_ids"], skip_special_tokens=False)
        number = text.split("conversation ")[1].split(".")[0]
        assert text.count("conversation ") == 1
        assert f"answer {number} one" in text and f"answer {number} two" in text


def _open_request() -> Any:
    from arctic_platform.rl.wire.operations import BY_NAME

    return BY_NAME["open_session"].request(job_id=1, ttl=600)


def _session_request(sid: str) -> Any:
    from arctic_platform.rl.wire.operations import BY_NAME

    return BY_NAME["session_trajectory"].request(session_id=sid)


def test_the_turn_a_request_continues_is_found_along_a_chain_of_three_thousand_requests():
    """No recursion along the conversation (Python's limit is 1000 frames)."""
    from arctic_platform.rl.agents.lineage import chat_parent
    from arctic_platform.rl.agents.models import (
        AssistantMessage,
        RequestRecord,
        SessionState,
        SessionTurn,
    )

    state = SessionState(session_id="s", model="m")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(3000):
        answer = AssistantMessage(content=f"a{n}")
        state.turns.append(
            SessionTurn(
                index=n, segment=0, parent=n - 1 if n else None, prompt_ids=[1],
                completion_ids=[2], completion_log_probs=[-0.5], message=answer,
                finish_reason="stop",
            )
        )  # fmt: skip
        added = messages if n == 0 else messages[-1:]
        state.requests.append(RequestRecord(turns=[n], parent=n - 1 if n else None, messages=added))
        messages = [*messages, answer.to_openai(), {"role": "user", "content": "."}]
    turn, continued, reason = chat_parent(state, messages, None)
    assert reason is None and turn is not None and turn.index == 2999
    assert continued == len(messages) - 2
