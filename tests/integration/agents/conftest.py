"""Fixtures of the agent-session integration tests: the tiny ChatML (tool-calling) model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chatml_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random Llama with the ChatML tokenizer (eos ``<|im_end|>``, ``<tool_call>``)."""
    from arctic_platform.rl.testing import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-chatml"
    return str(build_tiny_model(path, chat_format="chatml"))
