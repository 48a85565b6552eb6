"""Session-wide vLLM engines on the tiny model, built through the plugin registry (CPU)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from engine_build import registry_engine
from support.lasting import until_last_use

# Tests score the tiny model: a small KV cache is plenty and allocates quickly.
VLLM_TEST_OVERRIDES = {"kv_cache_memory_bytes": 256 << 20}


def _config(model_path: str, **overrides: Any) -> Any:
    from arctic_platform.rl.config import ArcticRLClientConfig

    return ArcticRLClientConfig(
        model_name=model_path,
        sampling_gpus=1,
        log_prob_gpus=1,
        host="127.0.0.1",
        port=7000,
        vllm_config={**VLLM_TEST_OVERRIDES, **overrides},
    )


def _engine(role: str, model_path: str) -> Any:
    return registry_engine("vllm", role, _config(model_path))


@pytest.fixture(scope="module")
def hf_model(tiny_model_path: str) -> Any:
    """The tiny checkpoint as a plain float32 transformers model (the engines' reference)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def vllm_test_config() -> Callable[..., Any]:
    """Builds an ``ArcticRLClientConfig`` for a vLLM engine: ``(model_path, **vllm_config)``."""
    return _config


def _shared_engine(role: str, model_path: str) -> Iterator[Any]:
    """Yields the ``vllm`` engine for ``role``; closed after the last test that uses it."""
    engine = _engine(role, model_path)
    release = until_last_use(f"vllm_{role}_engine", engine.close)
    yield engine
    release()


@pytest.fixture(scope="session")
def vllm_sampling_engine(tiny_model_path: str) -> Iterator[Any]:
    """The ``vllm`` sampling engine, shared by every test of the session that asks for it;
    closed after the last of them (``support.lasting``)."""
    yield from _shared_engine("sampling", tiny_model_path)


@pytest.fixture(scope="session")
def vllm_log_prob_engine(tiny_model_path: str) -> Iterator[Any]:
    """The ``vllm`` log-prob engine, shared by every test of the session that asks for it;
    closed after the last of them (``support.lasting``)."""
    yield from _shared_engine("log_prob", tiny_model_path)
