"""Two turns of verifiers 0.4.0's ``TrainClient`` against an agent session (run by
``test_verifiers_client.py`` with ``.venv-verifiers/bin/python``; it cannot import the
project, which needs openai 3.x while verifiers pins ``openai<3``).

Turn 1 is a user message with the tools ``--tools`` gives (the test's ``lookup`` tool); turn
2 is that history, the assistant turn turn 1 returned, and a ``tool`` message with a result.
The client renders each prompt with ``Qwen3Renderer`` from the local tokenizer dir, reads
``max_model_len`` from ``GET {base}/models`` and samples through
``POST {base without /v1}/inference/v1/generate`` with the session id as ``X-Session-ID``.
Every raw generate answer is captured (the renderer only returns parsed fields), and one
JSON object goes to stdout:
``{"models", "max_prompt_len", "stop_token_ids", "turns": [...], "raw": [...]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

KEY_VAR = "ARCTIC_RL_VERIFIERS_SESSION_KEY"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line: where the session is and which tokenizer renders the prompts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the session base, .../s/{sid}/v1")
    parser.add_argument("--api-key", required=True, help="the session key")
    parser.add_argument("--session-id", required=True, help="sent as X-Session-ID")
    parser.add_argument("--model", required=True, help="the model name the server lists")
    parser.add_argument("--renderer-model", required=True, help="the local tokenizer dir")
    parser.add_argument(
        "--tools", type=json.loads, required=True, help="the request's tools (a JSON list)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--bridge",
        action="store_true",
        help="pass each turn's PendingTurn from a verifiers trace graph (as its interception "
        "server does), so turn 2 is bridged from turn 1's ids instead of re-rendered",
    )
    return parser.parse_args(argv)


def _assistant_wire(response: Any) -> dict[str, Any]:
    """Turn 1's answer as the next request re-sends it (chat-completions wire)."""
    message = response.message
    wire: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    elif wire["content"] is None:
        wire["content"] = ""
    return wire


def _turn_summary(response: Any) -> dict[str, Any]:
    """What the test checks of one ``Response``: ids, log-probs, finish, parsed message."""
    tokens = response.tokens
    message = response.message
    return {
        "id": response.id,
        "finish_reason": response.finish_reason,
        "content": message.content,
        "tool_calls": [
            {"id": call.id, "name": call.name, "arguments": call.arguments}
            for call in message.tool_calls or []
        ],
        "prompt_ids": list(tokens.prompt_ids) if tokens is not None else None,
        "completion_ids": list(tokens.completion_ids) if tokens is not None else None,
        "completion_logprobs": list(tokens.completion_logprobs) if tokens is not None else None,
    }


def _trace() -> Any:
    """An empty verifiers trace: the message graph its interception server keeps per rollout,
    from which ``prepare_turn`` finds the sampled prefix a renderer bridges from."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    return Trace(task=TraceTask(type="lookup", data={}), agent=AgentInfo(config=AgentConfig()))


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    """Both turns; the captured raw answers and the model listing beside them."""
    import renderers.client as renderer_client
    from renderers.configs import Qwen3RendererConfig
    from verifiers.v1 import TrainClientConfig
    from verifiers.v1.clients.train import TrainClient
    from verifiers.v1.dialects import ChatDialect
    from verifiers.v1.types import SamplingConfig

    raw: list[dict[str, Any]] = []
    parse = renderer_client.parse_generate_response

    def capture(content: Any) -> Any:
        data = parse(content)
        raw.append(data)
        return data

    renderer_client.parse_generate_response = capture  # type: ignore[assignment]

    os.environ[KEY_VAR] = args.api_key
    config = TrainClientConfig(
        base_url=args.base_url,
        api_key_var=KEY_VAR,
        renderer=Qwen3RendererConfig(),
        renderer_model_name=args.renderer_model,
    )
    client = TrainClient(config)
    dialect = ChatDialect()
    sampling = SamplingConfig(
        temperature=1.0, max_tokens=args.max_tokens, cache_salt=args.session_id
    )
    trace = _trace() if args.bridge else None

    async def turn(messages: list[dict[str, Any]]) -> Any:
        body = {"model": args.model, "messages": messages, "tools": args.tools}
        if trace is None:
            return await client.get_response(dialect, body, sampling, session_id=args.session_id)
        from verifiers.v1.graph import prepare_turn

        request = dialect.parse_request(body)
        pending = prepare_turn(trace, request.messages, request.tools)
        response = await client.get_response(
            dialect, body, sampling, session_id=args.session_id, turn=pending
        )
        pending.commit(response)
        return response

    try:
        models = await client.client.get("/models", cast_to=dict[str, Any])
        messages: list[dict[str, Any]] = [{"role": "user", "content": "value of key 4821?"}]
        first = await turn(messages)
        calls = first.message.tool_calls or []
        call_id = calls[0].id if calls else "call_0"
        messages = [
            *messages,
            _assistant_wire(first),
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"value": "1234"})},
        ]
        second = await turn(messages)
    finally:
        await client.close()
    from renderers import create_renderer
    from renderers.base import load_tokenizer

    renderer = create_renderer(load_tokenizer(args.renderer_model), Qwen3RendererConfig())
    return {
        "models": models,
        "max_prompt_len": renderer_client._max_prompt_len_cache.get(
            (str(client.client.base_url), args.model)
        ),
        "stop_token_ids": list(renderer.get_stop_token_ids()),
        "bridged": [bool(r.tokens is not None and r.tokens.bridged) for r in (first, second)],
        "turns": [_turn_summary(first), _turn_summary(second)],
        "raw": raw,
    }


def main(argv: list[str] | None = None) -> int:
    """Run both turns and print the JSON report on stdout (errors go to stderr, exit 1)."""
    args = _arguments(argv)
    report = asyncio.run(_run(args))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
