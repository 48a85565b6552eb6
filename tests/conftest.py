"""Shared fixtures: a tiny local model built once per session, and CPU-friendly env vars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing in the suite may reach a model hub or send usage reports.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ~0.4 M-parameter random-init Llama with a locally trained tokenizer."""
    from arctic_platform.rl.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama"))
