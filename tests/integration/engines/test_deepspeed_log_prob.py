"""The DeepSpeed log-prob engine on CPU: log-probs, top-k, in-place weights, errors."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine_build import registry_engine

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from arctic_platform.rl.batch import BatchError  # noqa: E402
from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig  # noqa: E402
from arctic_platform.rl.errors import (  # noqa: E402
    EngineConfigError,
    EngineError,
    InvalidRequestError,
)

pytestmark = pytest.mark.slow


def pairs(seed: int, n: int = 5) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 400) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    completions = [[rng.randrange(10, 400) for _ in range(rng.randint(0, 12))] for _ in range(n)]
    return prompts, completions


def make_log_prob_engine(model_path: str, **worker_config: Any) -> Any:
    config = ArcticRLClientConfig(
        model_name=model_path,
        log_prob_gpus=1,
        log_prob_engine="deepspeed",
        log_prob_ds_config=worker_config or None,
    )
    return registry_engine("deepspeed", "log_prob", config)


def reference(model_path: str, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of a plain transformers forward, rows = positions predicting x_1.."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> Any:
    built = make_log_prob_engine(tiny_model_path, max_tokens_per_mb=32)
    yield built
    built.close()


def test_log_probs_and_top_k_match_a_plain_transformers_forward(
    engine: Any, tiny_model_path: str
) -> None:
    prompts, completions = pairs(0)
    out = engine.log_probs(prompts, completions, top_k=3)
    assert len(out) == len(prompts)
    worst = 0.0
    for p, c, res in zip(prompts, completions, out, strict=True):
        assert len(res["log_probs"]) == len(c) == len(res["top_k"])
        if not c:
            continue
        table = reference(tiny_model_path, p, c)
        for j, tok in enumerate(c):
            dist = table[len(p) + j - 1]
            worst = max(worst, abs(res["log_probs"][j] - float(dist[tok])))
            top = res["top_k"][j]
            assert len(top) == 3 and [t for t, _ in top] == dist.topk(3).indices.tolist()
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
            assert top[0][1] == pytest.approx(float(dist.max()), abs=1e-4)
    print(f"log-prob engine vs transformers (float32): max abs diff {worst:.3g}")
    assert worst < 1e-4


def test_top_k_zero_gives_no_alternatives(engine: Any) -> None:
    out = engine.log_probs([[11, 12]], [[13, 14, 15]], top_k=0)
    assert out[0]["top_k"] == [[], [], []] and len(out[0]["log_probs"]) == 3


def test_fwd_no_grad_agrees_with_log_probs(engine: Any) -> None:
    prompts, completions = pairs(1)
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    full = engine.fwd_no_grad({"input_ids": rows})
    parts = engine.log_probs(prompts, completions, top_k=0)
    for p, f, part in zip(prompts, full, parts, strict=True):
        assert f[0] == 0.0
        assert f[len(p) :] == pytest.approx(part["log_probs"], abs=1e-5)


def test_weights_from_a_training_engine_load_in_place(tiny_model_path: str) -> None:
    engine = make_log_prob_engine(tiny_model_path)
    config = ArcticRLClientConfig(
        model_name=tiny_model_path,
        training_gpus=1,
        training_config=TrainingConfig(optimizer={"lr": 1e-2}),
    )
    training = registry_engine("deepspeed", "training", config)
    try:
        rows = [p + c for p, c in zip(*pairs(2), strict=True)]
        batch = {"input_ids": rows}
        before = engine.fwd_no_grad(batch)
        for _ in range(3):
            training.fwd_bwd(batch, "cross_entropy")
            training.step()
        engine.load_weights(training.named_weights())
        assert engine.weight_norm() == pytest.approx(training.weight_norm(), rel=1e-12)
        trained = training.fwd_no_grad(batch)
        after = engine.fwd_no_grad(batch)
    finally:
        training.close()
        engine.close()
    diff = max(
        abs(a - b) for x, y in zip(after, trained, strict=True) for a, b in zip(x, y, strict=True)
    )
    moved = max(
        abs(a - b) for x, y in zip(after, before, strict=True) for a, b in zip(x, y, strict=True)
    )
    assert diff < 1e-5 and moved > 1e-2


def test_zero3_log_prob_engine_gives_the_same_log_probs(tiny_model_path: str, engine: Any) -> None:
    sharded = make_log_prob_engine(
        tiny_model_path,
        zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0},
    )
    try:
        prompts, completions = pairs(3)
        a = sharded.log_probs(prompts, completions, top_k=2)
        b = engine.log_probs(prompts, completions, top_k=2)
        weights = dict(sharded.named_weights())
        # Loading into sharded parameters goes through a ZeRO-3 gather and re-partition.
        scaled = [(k, v * 0.5) for k, v in engine.named_weights()]
        sharded.load_weights(scaled)
        reloaded = dict(sharded.named_weights())
    finally:
        sharded.close()
    for x, y in zip(a, b, strict=True):
        assert x["log_probs"] == pytest.approx(y["log_probs"], abs=1e-5)
        assert [[t for t, _ in k] for k in x["top_k"]] == [[t for t, _ in k] for k in y["top_k"]]
    plain = dict(engine.named_weights())
    assert all(torch.equal(weights[k], plain[k]) for k in plain)
    assert all(torch.equal(reloaded[k], v) for k, v in scaled)


def test_bad_requests_are_refused(engine: Any, tiny_model_path: str) -> None:
    with pytest.raises(BatchError, match="2 prompts but 1 completions"):
        engine.log_probs([[1], [2]], [[3]])
    with pytest.raises(BatchError, match="non-empty"):
        engine.log_probs([[]], [[3]])
    with pytest.raises(BatchError, match="outside the vocabulary"):
        engine.log_probs([[1]], [[10**6]])
    with pytest.raises(InvalidRequestError, match="top_k"):
        engine.log_probs([[1]], [[2]], top_k=-1)
    with pytest.raises(InvalidRequestError, match="vocabulary size"):  # not torch's topk error
        engine.log_probs([[1]], [[2]], top_k=10**6)
    with pytest.raises(InvalidRequestError, match="reference"):
        engine.fwd_no_grad({"input_ids": [[1, 2]]}, reference_model=True)
    with pytest.raises(EngineError, match="not a parameter"):
        engine.load_weights([("no.such.weight", torch.zeros(1))])
    with pytest.raises(EngineConfigError, match="float16"):
        make_log_prob_engine(tiny_model_path, dtype="float16")
    assert engine.sleep()["supported"] is False
