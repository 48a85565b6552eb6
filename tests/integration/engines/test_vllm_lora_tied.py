"""A LoRA adapter with ``lm_head`` among its targets on a tied-embedding Qwen2 base (issue 33
item 1): vLLM's Qwen2 class does not declare ``lm_head`` as a LoRA module, so the adapter was
refused ("expected target modules in {...} but received ['lm_head', 'lm_head']"). Served now,
its log-probs equal transformers+peft's, and the input embedding stays the base's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_reference import max_diff, random_peft_model, reference_log_probs

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # float32 vLLM+LoRA vs float32 transformers+peft, nats
PROMPTS = [[30, 31, 32, 33, 34], [40, 12, 200, 7]]
COMPLETIONS = [[50, 51, 52, 53], [100, 101, 102]]


@pytest.fixture(scope="module")
def tied_qwen2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random Qwen2 with tied input and output embeddings (as Qwen3-0.6B has)."""
    from arctic_platform.rl.testing import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-qwen2-tied"
    return str(build_tiny_model(path, arch="qwen2", tie_word_embeddings=True))


def _scores(model: Any) -> list[list[float]]:
    return [reference_log_probs(model, p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]


def _worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max(max_diff(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module", params=[8, 32], ids=lambda rank: f"rank{rank}")
def ranked_scorer(
    request: pytest.FixtureRequest, tied_qwen2: str, vllm_test_config: Any
) -> Iterator[tuple[int, Any]]:
    """A vLLM log-prob engine on the tied base in LoRA mode, and its rank (8 and 32)."""
    from engine_build import registry_engine

    from arctic_platform.rl.config import LoraConfig, TrainingConfig

    rank = int(request.param)
    training = TrainingConfig(lora=LoraConfig(rank=rank, alpha=2.0 * rank))
    config = vllm_test_config(tied_qwen2).model_copy(update={"training_config": training})
    engine = registry_engine("vllm", "log_prob", config)
    yield rank, engine
    engine.close()


def test_an_adapter_on_the_tied_lm_head_serves_the_log_probs_peft_computes(
    ranked_scorer, tied_qwen2
):
    from arctic_platform.rl.api import LoraConfig as ArcticLora

    rank, scorer = ranked_scorer
    targets = list(ArcticLora(rank=rank).target_modules)
    assert "lm_head" in targets
    model = random_peft_model(tied_qwen2, rank, 2.0 * rank, targets, seed=rank).eval()
    assert model.config.tie_word_embeddings
    exported = peft.get_peft_model_state_dict(model, save_embedding_layers=False)
    assert any(".lm_head.lora_" in name for name in exported)
    scorer.load_adapter(f"tied{rank}", 1, exported.items())
    expected = _scores(model)
    with model.disable_adapter():
        base = _scores(model)
    served = [
        r["log_probs"] for r in scorer.log_probs(PROMPTS, COMPLETIONS, 0, adapter=f"tied{rank}")
    ]
    diff, moved = _worst(served, expected), _worst(expected, base)
    print(f"rank {rank} on the tied lm_head: vLLM vs peft {diff:.2e}, adapter moves {moved:.3f}")
    assert moved > 1e-3
    assert diff < TOLERANCE
