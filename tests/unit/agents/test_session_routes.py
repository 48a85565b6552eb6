"""Agent sessions over the http app without an engine: the session operations, the OpenAI
routes driven by the real ``openai`` client (a fake ``generate`` samples fixed ids), the
OpenAI error bodies and the token rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.session_app import TOKEN, FakeServer
from support.session_app import http_app as _app
from support.session_app import open_session as _open
from support.session_app import openai_client as _client

from arctic_platform.rl.wire.operations import BY_NAME

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>'


@pytest.fixture
def tok_dir(chat_tok: Any, tmp_path: Any) -> str:
    chat_tok.raw.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


def test_two_turns_with_a_tool_are_token_faithful(chat_tok, tok_dir, tools):
    call_ids = [*chat_tok.encode(CALL), chat_tok.eos_id]
    answer_ids = [*chat_tok.encode("the value is 1234"), chat_tok.eos_id]
    server = FakeServer(tok_dir, [call_ids, answer_ids])
    http = _app(server, TOKEN)
    opened = _open(http)
    assert opened["base_url_path"] == f"/s/{opened['session_id']}/v1"
    client = _client(http, opened["base_url_path"], opened["key"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "value of key 4821?"}]
    first = client.chat.completions.create(
        model="m", messages=messages, tools=tools, max_tokens=32,
        logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "lookup" and call.function.arguments == '{"key":"4821"}'
    assert choice.model_extra["token_ids"] == call_ids
    assert [c.token_id for c in choice.logprobs.content] == call_ids
    assert len(choice.logprobs.content[0].top_logprobs) == 2
    assert server.requests[0].sampling_params["logprobs"] == 2
    prompt1 = first.model_extra["prompt_token_ids"]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "1234"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=tools)
    assert second.choices[0].message.content == "the value is 1234"
    assert "token_ids" not in (second.choices[0].model_extra or {})
    assert "prompt_token_ids" not in (second.model_extra or {})
    trajectory = http.get(
        f"/sessions/{opened['session_id']}/trajectory",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).json()
    turn1, turn2 = trajectory["turns"]
    assert turn1["prompt_ids"] == prompt1 and turn1["completion_ids"] == call_ids
    assert turn2["prompt_ids"][: len(prompt1) + len(call_ids)] == prompt1 + call_ids
    assert turn2["prefix_break"] is False
    (row,) = trajectory["rows"]
    sampled = {len(prompt1) + i for i in range(len(call_ids))}
    sampled |= {len(turn2["prompt_ids"]) + i for i in range(len(answer_ids))}
    assert {i for i, m in enumerate(row["loss_mask"]) if m == 1.0} == sampled
    assert trajectory["batch"]["input_ids"] == [row["input_ids"]]
    # the max_tokens default is the room left in the context
    assert server.requests[1].sampling_params["max_tokens"] == 1024 - len(turn2["prompt_ids"])


def test_errors_are_openai_bodies_and_the_session_keeps_answering(chat_tok, tok_dir):
    server = FakeServer(tok_dir, [])
    http = _app(server, TOKEN)
    opened = _open(http)
    client = _client(http, opened["base_url_path"], opened["key"])
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as missing:
        _client(http, "/s/0123abcd/v1", opened["key"]).chat.completions.create(
            model="m", messages=user
        )
    assert missing.value.body["type"] == "not_found_error"
    for bad in ([{"role": "wizard", "content": "x"}], [{"content": "x"}], []):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=bad)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "1 " * 1100}]
        )
    with pytest.raises(openai.BadRequestError, match="n > 1"):
        client.chat.completions.create(model="m", messages=user, n=2, stream=True)
    with pytest.raises(openai.AuthenticationError):
        _client(http, opened["base_url_path"], "wrong").chat.completions.create(
            model="m", messages=user
        )
    ok = client.chat.completions.create(model="m", messages=user)
    assert ok.choices[0].finish_reason == "stop"
    # the server token works as the API key too
    assert _client(http, opened["base_url_path"], TOKEN).models.list().data[0].id == tok_dir


def test_models_generate_and_the_header_carrier(chat_tok, tok_dir):
    server = FakeServer(tok_dir, [[5, 6, 3], [7, 3], [8, 3]])
    http = _app(server, None)  # loopback without a token: an open session is enough
    opened = _open(http, None)
    sid = opened["session_id"]
    models = http.get(f"/s/{sid}/v1/models").json()
    assert models["data"][0]["id"] == tok_dir and models["data"][0]["max_model_len"] == 1024
    body = {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}
    answer = http.post(f"/s/{sid}/inference/v1/generate", json=body).json()
    choice = answer["choices"][0]
    assert choice["token_ids"] == [5, 6, 3] and choice["finish_reason"] == "stop"
    assert [c["token"] for c in choice["logprobs"]["content"]] == [
        "token_id:5", "token_id:6", "token_id:3",
    ]  # fmt: skip
    assert [c["token_id"] for c in choice["logprobs"]["content"]] == [5, 6, 3]
    extended = {**body, "token_ids": [1, 2, 3, 5, 6, 3, 9]}
    by_header = http.post("/inference/v1/generate", json=extended, headers={"X-Session-ID": sid})
    assert by_header.status_code == 200, by_header.text
    by_key = http.post(
        "/inference/v1/generate",
        json={**body, "token_ids": [4]},
        headers={"Authorization": f"Bearer {opened['key']}"},
    )
    assert by_key.status_code == 200
    turns = server.agents.session_trajectory(BY_NAME["session_trajectory"].request(session_id=sid))
    breaks = [t["prefix_break"] for t in turns["turns"]]
    assert breaks == [False, False, True] and [t["segment"] for t in turns["turns"]] == [0, 0, 1]
    listed = http.get("/sessions", params={"job_id": 1}).json()["sessions"]
    assert [(s["session_id"], s["turns"]) for s in listed] == [(sid, 3)]
    assert http.post(f"/sessions/{sid}/close").json()["closed"] is True
    gone = http.post(f"/s/{sid}/inference/v1/generate", json=body)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert http.get(f"/sessions/{sid}/trajectory").status_code == 404


def test_sessions_expire_and_a_stale_session_is_refused(chat_tok, tok_dir):
    server = FakeServer(tok_dir, [])
    opened = server.agents.open_session(
        BY_NAME["open_session"].request(job_id=1, max_staleness=0, ttl=60)
    )
    sid = opened["session_id"]
    user = [{"role": "user", "content": "hi"}]
    server.agents.chat_completion(sid, {"messages": user})
    server.jobs.job.weight_version = 1
    from arctic_platform.rl.errors import BadRequestError, NotFoundError

    with pytest.raises(BadRequestError, match="max_staleness"):
        server.agents.chat_completion(sid, {"messages": user})
    server.agents.store.expire(now=server.agents.store.get(sid).state.expires_at)
    with pytest.raises(NotFoundError):
        server.agents.models(sid)


def test_tool_choice_none_stops_at_a_tool_call_and_required_is_constrained(
    chat_tok, tok_dir, tools
):
    server = FakeServer(tok_dir, [])
    http = _app(server, None)
    opened = _open(http, None)
    client = _client(http, opened["base_url_path"], opened["key"])
    user = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="m", messages=user, tools=tools, tool_choice="none")
    assert server.requests[-1].sampling_params["stop_token_ids"] == [
        chat_tok.token_id("<tool_call>")
    ]
    client.chat.completions.create(model="m", messages=user, tools=tools, tool_choice="required")
    tag = server.requests[-1].sampling_params["structured_outputs"]["structural_tag"]
    first = tag["format"]["elements"][0]
    assert first == {"type": "token", "token": chat_tok.token_id("<tool_call>")}
    named = {"type": "function", "function": {"name": "lookup"}}
    client.chat.completions.create(model="m", messages=user, tools=tools, tool_choice=named)
    assert "structured_outputs" in server.requests[-1].sampling_params
    sent = len(server.requests)
    with pytest.raises(openai.BadRequestError, match="nowhere"):
        client.chat.completions.create(
            model="m",
            messages=user,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "nowhere"}},
        )
    with pytest.raises(openai.BadRequestError, match="required"):
        client.chat.completions.create(model="m", messages=user, tool_choice="required")
    assert len(server.requests) == sent


def test_a_streamed_turn_is_openai_chunks_then_done_and_is_recorded(chat_tok, tok_dir, tools):
    call_ids = [*chat_tok.encode("ok " + CALL), chat_tok.eos_id]
    text_ids = [*chat_tok.encode("the value is 1234"), chat_tok.eos_id]
    server = FakeServer(tok_dir, [call_ids, text_ids])
    http = _app(server, None)
    opened = _open(http, None)
    client = _client(http, opened["base_url_path"], opened["key"])
    user = [{"role": "user", "content": "value of key 4821?"}]
    stream = client.chat.completions.create(
        model="m", messages=user, tools=tools, stream=True, logprobs=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["prompt_token_ids"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(call_ids)
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert [d.finish_reason for d in deltas][-1] == "tool_calls"
    assert all(d.finish_reason is None for d in deltas[:-1])
    (call,) = [t for d in deltas for t in d.delta.tool_calls or []]
    assert (call.index, call.type, call.function.name) == (0, "function", "lookup")
    assert call.function.arguments == '{"key":"4821"}'
    assert "".join(d.delta.content or "" for d in deltas) == "ok"
    assert [i for d in deltas for i in d.model_extra["token_ids"]] == call_ids
    assert [c.token_id for d in deltas for c in d.logprobs.content] == call_ids
    raw = http.post(
        f"{opened['base_url_path']}/chat/completions",
        json={"messages": user, "stream": True},
        headers={"Authorization": f"Bearer {opened['key']}"},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]
    )
    assert text == "the value is 1234"
    trajectory = http.get(f"/sessions/{opened['session_id']}/trajectory").json()
    assert [t["completion_ids"] for t in trajectory["turns"]] == [call_ids, text_ids]


def test_completions_take_text_or_ids_and_record_turns_that_extend(chat_tok, tok_dir):
    first_ids = [*chat_tok.encode(" 1234"), chat_tok.eos_id]
    server = FakeServer(tok_dir, [first_ids, [chat_tok.eos_id]])
    http = _app(server, TOKEN)
    opened = _open(http)
    client = _client(http, opened["base_url_path"], opened["key"])
    first = client.completions.create(
        model="m", prompt="lookup 4821:", max_tokens=8, logprobs=2,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = first.choices[0]
    prompt = chat_tok.encode("lookup 4821:")
    assert choice.model_extra["prompt_token_ids"] == prompt  # encoded as written
    assert choice.model_extra["token_ids"] == first_ids
    assert choice.text == chat_tok.decode(first_ids)
    assert choice.logprobs.token_logprobs == [-0.5] * len(first_ids)
    assert len(choice.logprobs.top_logprobs[0]) == 2
    assert first.usage.prompt_tokens == len(prompt)
    assert server.requests[0].sampling_params["max_tokens"] == 8
    # token ids continuing the first turn stay in its segment; a default max_tokens of 16
    second = client.completions.create(model="m", prompt=[*prompt, *first_ids, 50])
    assert second.choices[0].logprobs is None
    assert server.requests[1].sampling_params["max_tokens"] == 16
    turns = http.get(
        f"/sessions/{opened['session_id']}/trajectory",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).json()["turns"]
    assert [t["segment"] for t in turns] == [0, 0]
    assert turns[1]["reused"] == len(prompt) + len(first_ids)
    # refused, and the session still answers
    bad_fields = ({"best_of": 2}, {"echo": True}, {"suffix": "x"}, {"prompt": ["a", "b"]})
    for bad in (*bad_fields, {"prompt": ""}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**{"model": "m", "prompt": "x", **bad})
    assert client.completions.create(model="m", prompt=[5, 6]).choices[0].finish_reason == "stop"


def test_n_choices_are_sibling_turns_and_the_client_may_continue_any(chat_tok, tok_dir):
    eos = chat_tok.eos_id
    a, b, c = ([*chat_tok.encode(text), eos] for text in ("red", "green", "blue"))
    server = FakeServer(tok_dir, [a, b, c, [*chat_tok.encode("ok"), eos]])
    http = _app(server, TOKEN)
    opened = _open(http)
    client = _client(http, opened["base_url_path"], opened["key"])
    user = [{"role": "user", "content": "a colour?"}]
    first = client.chat.completions.create(
        model="m", messages=user, n=3, extra_body={"return_token_ids": True}
    )
    assert [ch.index for ch in first.choices] == [0, 1, 2]
    assert [ch.message.content for ch in first.choices] == ["red", "green", "blue"]
    assert [ch.model_extra["token_ids"] for ch in first.choices] == [a, b, c]
    assert first.usage.completion_tokens == len(a) + len(b) + len(c)
    assert server.requests[0].sampling_params["n"] == 3
    # the client goes on with choice 1: turn 2 extends exactly that choice's ids
    history = [*user, {"role": "assistant", "content": "green"}, {"role": "user", "content": "?"}]
    client.chat.completions.create(model="m", messages=history)
    trajectory = http.get(
        f"/sessions/{opened['session_id']}/trajectory",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).json()
    turns = trajectory["turns"]
    assert [t["segment"] for t in turns] == [0, 0, 0, 0] and not turns[3]["prefix_break"]
    prompt = first.model_extra["prompt_token_ids"]
    assert turns[3]["prompt_ids"][: len(prompt) + len(b)] == prompt + b
    # rows: the unchosen choices are rows of their own; the chosen one is inside turn 2's row
    rows = trajectory["rows"]
    assert [r["turns"] for r in rows] == [[0], [2], [1, 3]]
    assert rows[0]["input_ids"] == prompt + a and rows[1]["input_ids"] == prompt + c
    chosen = rows[2]
    assert sum(chosen["loss_mask"]) == len(b) + len(turns[3]["completion_ids"])
    assert chosen["loss_mask"][len(prompt) : len(prompt) + len(b)] == [1.0] * len(b)


def test_session_http_server_serves_the_routes_beside_a_transport_that_is_not_http(
    chat_tok, tok_dir
):
    """What the ray transport's actor runs: the session routes alone, on a free loopback port
    in a thread, with the token rule; ``open_session`` then answers its ``http_root``."""
    from arctic_platform.rl.api import ServeError, SessionHTTPServer

    with pytest.raises(ServeError, match="token"):
        SessionHTTPServer(FakeServer(tok_dir, []), "0.0.0.0", None).start()
    server = FakeServer(tok_dir, [[*chat_tok.encode("Hello there."), chat_tok.eos_id]])
    sessions = SessionHTTPServer(server, "127.0.0.1", TOKEN, stop=server.shutdown_requested)
    root = sessions.start()
    try:
        assert root.startswith("http://127.0.0.1:") and not root.endswith(":0")
        server.agents.http_root = sessions.root
        opened = server.handle("open_session", {"job_id": 1, "ttl": 60})
        assert opened["http_root"] == root
        client = openai.OpenAI(
            base_url=root + opened["base_url_path"], api_key=opened["key"], max_retries=0
        )
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        assert answer.choices[0].message.content == "Hello there."
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=root + opened["base_url_path"], api_key="wrong", max_retries=0
            ).models.list()
        with pytest.raises(openai.NotFoundError):
            openai.OpenAI(base_url=root + "/s/nope/v1", api_key=TOKEN, max_retries=0).models.list()
        import httpx

        assert httpx.get(root + "/health").json() == {"ok": True}
    finally:
        sessions.close()
    assert sessions._thread is not None and not sessions._thread.is_alive()
