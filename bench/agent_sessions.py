"""A multi-turn episode through a session's OpenAI routes vs the same token work through
``ArcticRLClient.generate``, paired in one run (issue 26; goal: at most 1.10).

One local server over http holds a sampling job of the tiny ChatML model. The session side
runs a ``turns``-turn chat with the real ``openai`` client on a fresh session: each turn sends
the whole history (the previous answers re-sent as the client got them, plus a new user
message), and the server builds the prompt token-faithfully (previous prompt + sampled ids +
the template's bridge), samples, parses tool calls and records the turn. The direct side sends
the very same prompt ids (read once from a session's trajectory) to ``generate`` with the same
sampling parameters and seed, so both sides sample the same tokens. Each round runs one
episode a side in alternating order (``bench.timing.paired``); the ratio is the median of the
rounds' session / direct ratios: what the OpenAI surface, the chat template and the session
bookkeeping add to the same sampling work.

Each episode builds its own ``openai.OpenAI`` on one shared ``httpx.Client``, as an agent
harness does (the lookup demo shares one too) and as ``ArcticRLClient`` keeps its own
connection: an ``OpenAI()`` with a fresh HTTP client costs ~28 ms here (its SSL context),
which the first measurement (ratio 1.20) counted as session overhead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from bench.servers import loopback_config
from bench.timing import Side, paired

TURNS = 3
MAX_TOKENS = 32
SEED = 11
QUESTIONS = ["value of key 4821?", "and the key 1234?", "add them"]


def run(turns: int = TURNS, repeats: int = 9, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """Median seconds of a ``turns``-turn episode a side and the session / direct ratio."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import openai

    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.testing import build_tiny_model, free_port

    root = Path(tempfile.mkdtemp(prefix="arctic-bench-agents-"))
    os.environ["ARCTIC_RL_HOME"] = str(root / "arctic")
    model = str(
        build_tiny_model(
            Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny-chatml",
            chat_format="chatml",
        )
    )
    config = loopback_config(model, free_port(), training_gpus=0, sampling_gpus=1, log_prob_gpus=0)
    questions = (QUESTIONS * turns)[:turns]
    params = {"max_tokens": max_tokens, "temperature": 1.0, "seed": SEED}
    client = ArcticRLClient(config, progress=False)
    import httpx

    http = httpx.Client(trust_env=False, timeout=600)
    try:

        def episode() -> dict[str, Any]:
            """One episode on a fresh session; its session id and the tokens it sampled."""
            handle = client.open_session(ttl=600)
            chat = openai.OpenAI(
                base_url=handle.base_url, api_key=handle.api_key, max_retries=0, http_client=http
            )
            messages: list[dict[str, Any]] = []
            sampled = 0
            for question in questions:
                messages.append({"role": "user", "content": question})
                answer = chat.chat.completions.create(
                    model=handle.model,
                    messages=messages,  # type: ignore[arg-type]
                    logprobs=True,
                    extra_body={"return_token_ids": True},
                    **params,  # type: ignore[arg-type]
                )
                choice = answer.choices[0]
                sampled += len(choice.model_extra["token_ids"])
                messages.append({"role": "assistant", "content": choice.message.content or ""})
            return {"session_id": handle.session_id, "tokens": sampled}

        first = episode()
        trajectory = client.session_trajectory(first["session_id"])
        prompts = [turn["prompt_ids"] for turn in trajectory["turns"]]
        breaks = [turn["prefix_break"] for turn in trajectory["turns"]]

        def direct() -> dict[str, Any]:
            """The same prompt ids through ``generate``, one call a turn, same seed."""
            sampled = 0
            for prompt in prompts:
                out = client.generate([prompt], {**params, "n": 1, "logprobs": 0})
                sampled += len(out["outputs"][0]["completions"][0]["token_ids"])
            return {"tokens": sampled}

        def tokens(answer: dict[str, Any]) -> dict[str, float]:
            return {"tokens": float(answer["tokens"])}

        timing = paired(
            {"session": Side(episode, measure=tokens), "direct": Side(direct, measure=tokens)},
            repeats=repeats,
            warmup=1,
        )
    finally:
        http.close()
        client.shutdown()
    return {
        "turns": turns,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prefix_breaks": breaks,
        "prompt_lengths": [len(p) for p in prompts],
        "session_tokens": timing.median("session", "tokens"),
        "direct_tokens": timing.median("direct", "tokens"),
        "session_seconds": timing.median("session"),
        "direct_seconds": timing.median("direct"),
        "ratio": timing.ratio("session", "direct"),
        "timing": timing.model_dump(),
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The markdown row of ``python -m bench``."""
    return [
        (
            f"{report['turns']}-turn episode through a session's /chat/completions vs the same "
            f"prompt ids through generate (tiny ChatML model, {report['max_tokens']} tokens a "
            "turn)",
            f"{report['session_seconds'] * 1e3:.0f} vs {report['direct_seconds'] * 1e3:.0f} ms "
            f"({report['session_tokens']:.0f} vs {report['direct_tokens']:.0f} tokens)",
            f"{report['ratio']:.3f} (median of paired ratios; goal 1.10)",
        )
    ]


if __name__ == "__main__":  # pragma: no cover - a manual run
    import json

    result = run()
    result.pop("timing")
    print(json.dumps(result, indent=2))
    for row in rows(result):
        print(" | ".join(row))
