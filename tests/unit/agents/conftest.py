"""Shared fixtures of the agent-session unit tests: the tiny ChatML tokenizer, built once."""

from __future__ import annotations

from typing import Any

import pytest
from support.tools import lookup_tool

pytest.importorskip("transformers")

TOOLS: list[dict[str, Any]] = [lookup_tool()]


@pytest.fixture(scope="session")
def chat_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A ``ChatTokenizer`` over the tiny ChatML tokenizer (trained once per test session)."""
    from arctic_platform.rl.agents import ChatTokenizer
    from arctic_platform.rl.testing import build_tokenizer

    path = build_tokenizer(tmp_path_factory.mktemp("agents-chatml"), chat_format="chatml")
    return ChatTokenizer.from_pretrained(path)


@pytest.fixture
def tools() -> list[dict[str, Any]]:
    """The strict ``lookup`` tool as openai-agents sends it."""
    return [dict(t) for t in TOOLS]
