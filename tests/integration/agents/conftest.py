"""Fixtures of the agent-session integration tests: the tiny ChatML (tool-calling) model and
one local server that every module of this folder drives (started once: ~28 s each before).

The server speaks the **ray** transport to its client, so every OpenAI client here reaches
the session routes that the server actor serves over HTTP beside it (issue 26: served over
HTTP whichever transport the client uses). The http transport's copy of the routes is driven
by ``tests/unit/agents/test_session_routes.py`` and the lookup demo's e2e test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.clients import client_config, local_client
from support.lasting import until_last_use


@pytest.fixture(scope="session")
def chatml_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random Llama with the ChatML tokenizer (eos ``<|im_end|>``, ``<tool_call>``)."""
    from arctic_platform.rl.testing import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-chatml"
    return str(build_tiny_model(path, chat_format="chatml"))


@pytest.fixture(scope="session")
def agents_rl(chatml_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A ray-transport client of a local server holding a training and a sampling job of the
    ChatML model (the training job for weight syncs between turns); shut down after the last
    test that uses it. Tests that sync weights compare versions relative to what they find."""
    config = client_config(chatml_model_path, comm_protocol="ray", host=None, log_prob_gpus=0)
    running = local_client(tmp_path_factory.mktemp("agents-home"), config)
    client = running.__enter__()
    release = until_last_use("agents_rl", lambda: running.__exit__(None, None, None))
    yield client
    release()
