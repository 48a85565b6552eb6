"""xgrammar's matcher over a ``structured_outputs`` structural tag, for the unit tests that
check which token sequences a decoding constraint lets through."""

from __future__ import annotations

import json
from typing import Any

import pytest


def tag_matcher(chat_tok: Any, constraint: dict[str, Any]) -> Any:
    """A fresh ``GrammarMatcher`` for ``constraint["structural_tag"]`` on ``chat_tok``."""
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo.from_huggingface(chat_tok.raw, vocab_size=len(chat_tok.raw))
    compiled = xgr.GrammarCompiler(info).compile_structural_tag(
        json.dumps(constraint["structural_tag"])
    )
    return xgr.GrammarMatcher(compiled)


def accepts(matcher: Any, ids: list[int]) -> bool:
    """Whether ``matcher`` takes every id of ``ids`` in turn."""
    return all(matcher.accept_token(i) for i in ids)
