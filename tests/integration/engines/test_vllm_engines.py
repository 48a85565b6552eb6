"""The vLLM sampling and log-prob engines on CPU: shapes, seeds, log-probs vs transformers,
in-place weights, errors. One engine of each kind serves the whole session (conftest)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from engine_program import run_engine_program
from engine_reference import max_diff, reference_log_probs

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from arctic_platform.rl.errors import EngineError, InvalidRequestError  # noqa: E402

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # float32 vLLM vs float32 transformers, nats
PROMPTS: list[str | list[int]] = ["1 + 2 =", "the answer is", [30, 31, 32, 33], "write digits"]


def perturbed_state(model: Any, seed: int, scale: float = 0.05) -> dict[str, Any]:
    """A copy of ``model``'s weights with Gaussian noise added (checkpoint names)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: t.detach() + scale * torch.randn(t.shape, generator=generator)
        for name, t in model.state_dict().items()
    }


def l2_norm(tensors: Any) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def random_pairs(seed: int, n: int = 6) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 400) for _ in range(rng.randint(1, 10))] for _ in range(n)]
    completions = [[rng.randrange(10, 400) for _ in range(rng.randint(1, 16))] for _ in range(n)]
    return prompts, completions


# --- the sampling engine -------------------------------------------------------------------


def test_generate_returns_prompt_ids_and_n_completions_per_prompt(vllm_sampling_engine):
    results = vllm_sampling_engine.generate(PROMPTS, {"n": 3, "max_tokens": 5, "seed": 1})

    assert len(results) == len(PROMPTS)
    tokenizer = vllm_sampling_engine.tokenizer
    assert results[0]["prompt_token_ids"] == tokenizer.encode(PROMPTS[0])
    assert results[2]["prompt_token_ids"] == PROMPTS[2]
    for result in results:
        assert len(result["completions"]) == 3
        for completion in result["completions"]:
            assert set(completion) >= {"token_ids", "text", "logprobs", "finish_reason"}
            assert 1 <= len(completion["token_ids"]) <= 5
            assert len(completion["logprobs"]) == len(completion["token_ids"])
            assert all(isinstance(x, float) and x <= 0.0 for x in completion["logprobs"])
            assert isinstance(completion["text"], str)
            assert completion["finish_reason"] in ("length", "stop")


def test_top_logprobs_are_the_k_best_alternatives_best_first(vllm_sampling_engine):
    result = vllm_sampling_engine.generate([PROMPTS[0]], {"max_tokens": 4, "logprobs": 3})
    completion = result[0]["completions"][0]

    assert len(completion["top_logprobs"]) == len(completion["token_ids"])
    for step, own in zip(completion["top_logprobs"], completion["logprobs"], strict=True):
        values = [lp for _, lp in step]
        assert len(step) == 3 and values == sorted(values, reverse=True)
        assert own <= values[0] + 1e-6


def test_seeded_sampling_is_reproducible_and_seed_dependent(vllm_sampling_engine):
    params = {"n": 4, "max_tokens": 12, "temperature": 1.0, "seed": 1234}
    first = vllm_sampling_engine.generate(PROMPTS, params)
    again = vllm_sampling_engine.generate(PROMPTS, params)
    other = vllm_sampling_engine.generate(PROMPTS, {**params, "seed": 4321})

    assert first == again
    assert [c["token_ids"] for r in first for c in r["completions"]] != [
        c["token_ids"] for r in other for c in r["completions"]
    ]


def test_seeded_samples_do_not_depend_on_the_rest_of_the_batch(vllm_sampling_engine):
    params = {"n": 2, "max_tokens": 10, "seed": 7}
    alone = vllm_sampling_engine.generate([PROMPTS[0]], params)
    batched = vllm_sampling_engine.generate([PROMPTS[0], PROMPTS[1]], params)

    assert batched[0] == alone[0]


def test_identical_prompts_in_one_seeded_call_get_independent_samples(vllm_sampling_engine):
    results = vllm_sampling_engine.generate([PROMPTS[1]] * 2, {"max_tokens": 16, "seed": 3})

    assert results[0]["completions"][0]["token_ids"] != results[1]["completions"][0]["token_ids"]


def test_sampled_token_logprobs_match_transformers(vllm_sampling_engine, hf_model):
    results = vllm_sampling_engine.generate(PROMPTS, {"n": 4, "max_tokens": 16, "seed": 11})

    worst = 0.0
    for result in results:
        for completion in result["completions"]:
            expected = reference_log_probs(
                hf_model, result["prompt_token_ids"], completion["token_ids"]
            )
            worst = max(worst, max_diff(expected, completion["logprobs"]))
    print(f"sampled-token log-probs vs transformers: max |diff| = {worst:.2e}")
    assert worst < TOLERANCE


def test_sampled_logprobs_are_of_the_model_not_the_tempered_distribution(
    vllm_sampling_engine, hf_model
):
    params = {"n": 2, "max_tokens": 8, "seed": 5, "temperature": 0.6, "top_p": 0.9}
    results = vllm_sampling_engine.generate(PROMPTS[:2], params)

    for result in results:
        for completion in result["completions"]:
            expected = reference_log_probs(
                hf_model, result["prompt_token_ids"], completion["token_ids"]
            )
            assert max_diff(expected, completion["logprobs"]) < TOLERANCE


def test_stop_strings_end_a_completion_with_finish_reason_stop(vllm_sampling_engine):
    probe = vllm_sampling_engine.generate([PROMPTS[3]], {"max_tokens": 12, "seed": 5})
    text = probe[0]["completions"][0]["text"]
    stop = next((ch for ch in text[1:] if ch.strip()), None)
    if stop is None:
        pytest.skip(f"sampled text {text!r} has no usable stop character")

    stopped = vllm_sampling_engine.generate(
        [PROMPTS[3]], {"max_tokens": 12, "seed": 5, "stop": [stop]}
    )[0]["completions"][0]

    assert stopped["finish_reason"] == "stop"
    assert stop not in stopped["text"]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"logprobs": -1}, "logprobs"),
        ({"seed": "x"}, "seed"),
        ({"stop": [3]}, "stop"),
        ({"beam_width": 2}, "beam_width"),
    ],
)
def test_invalid_sampling_params_raise_value_error_naming_the_key(
    vllm_sampling_engine, params, key
):
    with pytest.raises(ValueError, match=key) as info:
        vllm_sampling_engine.generate(PROMPTS[:1], params)
    assert isinstance(info.value, InvalidRequestError)


def test_prompt_longer_than_the_context_is_a_value_error(vllm_sampling_engine):
    too_long = [40] * vllm_sampling_engine.max_model_len

    with pytest.raises(ValueError, match="max_model_len"):
        vllm_sampling_engine.generate([too_long], {"max_tokens": 1})


def test_token_ids_outside_the_vocabulary_are_a_value_error(vllm_sampling_engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vllm_sampling_engine.generate([[1, vllm_sampling_engine.vocab_size]], {})


def test_sleep_on_cpu_says_it_is_not_supported_and_keeps_serving(vllm_sampling_engine):
    slept = vllm_sampling_engine.sleep(1)
    woke = vllm_sampling_engine.wake()

    assert slept["supported"] is False and "CPU" in slept["reason"]
    assert woke["supported"] is False
    assert vllm_sampling_engine.generate([PROMPTS[0]], {"max_tokens": 2})


# --- the log-prob engine -------------------------------------------------------------------


def test_log_probs_match_transformers_with_top_k(vllm_log_prob_engine, hf_model):
    prompts, completions = random_pairs(seed=0)
    results = vllm_log_prob_engine.log_probs(prompts, completions, top_k=3)

    worst = 0.0
    for prompt, completion, result in zip(prompts, completions, results, strict=True):
        expected = reference_log_probs(hf_model, prompt, completion)
        worst = max(worst, max_diff(expected, result["log_probs"]))
        assert len(result["top_k"]) == len(completion)
        ids = prompt + completion
        with torch.no_grad():
            table = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), -1)
        for j, step in enumerate(result["top_k"]):
            best = torch.topk(table[len(prompt) + j - 1], 3)
            assert [t for t, _ in step] == best.indices.tolist()
            worst = max(worst, max_diff(best.values.tolist(), [lp for _, lp in step]))
    print(f"log-prob engine vs transformers: max |diff| = {worst:.2e}")
    assert worst < TOLERANCE


def test_log_probs_of_an_empty_completion_are_empty(vllm_log_prob_engine):
    results = vllm_log_prob_engine.log_probs([[5, 6], [7]], [[], [8, 9]], top_k=0)

    assert results[0]["log_probs"] == [] and results[0]["top_k"] == []
    assert len(results[1]["log_probs"]) == 2 and results[1]["top_k"] == [[], []]


def test_fwd_no_grad_puts_zero_first_like_the_trainer(vllm_log_prob_engine, hf_model):
    rows = [[11, 12, 13, 14], [20, 21]]
    result = vllm_log_prob_engine.fwd_no_grad({"input_ids": rows})

    for row, got in zip(rows, result, strict=True):
        assert got[0] == 0.0 and len(got) == len(row)
        assert max_diff(reference_log_probs(hf_model, row[:1], row[1:]), got[1:]) < TOLERANCE


def test_fwd_no_grad_of_a_left_padded_dense_batch_equals_its_rows(vllm_log_prob_engine):
    rows = [[11, 12, 13, 14], [20, 21]]
    ids = torch.tensor([[11, 12, 13, 14], [0, 0, 20, 21]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    dense = vllm_log_prob_engine.fwd_no_grad({"input_ids": ids, "attention_mask": mask})
    assert dense == vllm_log_prob_engine.fwd_no_grad({"input_ids": rows})
    too_long = [[5] * vllm_log_prob_engine.max_model_len]
    with pytest.raises(ValueError, match=r"input_ids\[0\].*context"):
        vllm_log_prob_engine.fwd_no_grad({"input_ids": too_long})


def test_log_probs_reject_mismatched_or_too_long_input(vllm_log_prob_engine):
    with pytest.raises(ValueError, match="completions"):
        vllm_log_prob_engine.log_probs([[1, 2]], [[3], [4]])
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_log_prob_engine.log_probs([[5]], [[6] * vllm_log_prob_engine.max_model_len])
    with pytest.raises(ValueError, match="top_k"):
        vllm_log_prob_engine.log_probs([[5]], [[6]], top_k=-1)


# --- weights -------------------------------------------------------------------------------


def test_weight_norm_equals_the_checkpoint_norm(
    vllm_sampling_engine, vllm_log_prob_engine, hf_model
):
    expected = l2_norm(hf_model.parameters())

    assert vllm_sampling_engine.weight_norm() == pytest.approx(expected, rel=1e-12)
    assert vllm_log_prob_engine.weight_norm() == pytest.approx(expected, rel=1e-12)


def test_served_weights_read_back_from_the_kernels_have_the_checkpoint_norm(
    vllm_log_prob_engine, hf_model
):
    served = vllm_log_prob_engine.served_weight_norm()

    # q/k/v and gate/up are fused, and on CPU every linear weight lives in a GEMM kernel.
    assert any("qkv_proj" in name for name in served["read_back"])
    assert any("gate_up_proj" in name for name in served["read_back"])
    assert served["norm"] == pytest.approx(l2_norm(hf_model.parameters()), rel=1e-12)


@pytest.mark.parametrize("bucket_bytes", [None, 300_000], ids=["tensors", "safetensors-buckets"])
def test_load_weights_in_place_serves_the_new_weights(
    vllm_sampling_engine, vllm_log_prob_engine, hf_model, bucket_bytes
):
    import copy

    prompts, completions = random_pairs(seed=1)
    before = vllm_log_prob_engine.log_probs(prompts, completions, top_k=0)
    sampled_before = vllm_sampling_engine.generate(PROMPTS, {"max_tokens": 8, "seed": 2})
    original = {n: t.detach().clone() for n, t in hf_model.state_dict().items()}
    new_model = copy.deepcopy(hf_model)
    new_model.load_state_dict(perturbed_state(hf_model, seed=3))
    try:
        for engine in (vllm_sampling_engine, vllm_log_prob_engine):
            engine.load_weights(new_model.state_dict().items(), bucket_bytes=bucket_bytes)
            assert engine.last_load["tensors"] == len(original)
        after = vllm_log_prob_engine.log_probs(prompts, completions, top_k=0)
        sampled = vllm_sampling_engine.generate(PROMPTS, {"max_tokens": 8, "seed": 2})

        worst_new = worst_old = 0.0
        for p, c, old, new in zip(prompts, completions, before, after, strict=True):
            worst_new = max(
                worst_new, max_diff(reference_log_probs(new_model, p, c), new["log_probs"])
            )
            worst_old = max(worst_old, max_diff(old["log_probs"], new["log_probs"]))
        # Same prompts as before the update: stale cached prefixes would show up here.
        for result in sampled:
            for completion in result["completions"]:
                expected = reference_log_probs(
                    new_model, result["prompt_token_ids"], completion["token_ids"]
                )
                worst_new = max(worst_new, max_diff(expected, completion["logprobs"]))
        print(
            f"after load_weights: max |diff| vs new weights {worst_new:.2e}, vs old {worst_old:.2f}"
        )
        assert worst_new < TOLERANCE
        assert worst_old > 0.1
        assert [c["token_ids"] for r in sampled for c in r["completions"]] != [
            c["token_ids"] for r in sampled_before for c in r["completions"]
        ]
        expected_norm = l2_norm(new_model.parameters())
        assert vllm_sampling_engine.weight_norm() == pytest.approx(expected_norm, rel=1e-12)
        assert vllm_log_prob_engine.weight_norm() == pytest.approx(expected_norm, rel=1e-12)
        served = vllm_sampling_engine.served_weight_norm()["norm"]
        assert served == pytest.approx(expected_norm, rel=1e-12)
    finally:
        for engine in (vllm_sampling_engine, vllm_log_prob_engine):
            engine.load_weights(original.items())
    restored = vllm_log_prob_engine.log_probs(prompts, completions, top_k=0)
    assert (
        max(max_diff(a["log_probs"], b["log_probs"]) for a, b in zip(before, restored, strict=True))
        < 1e-6
    )


def test_load_weights_refuses_unknown_names_and_split_fused_modules(vllm_log_prob_engine):
    before = vllm_log_prob_engine.log_probs([[5, 6]], [[7, 8]], top_k=0)
    norm = vllm_log_prob_engine.weight_norm()

    with pytest.raises(ValueError, match="match no weight"):
        vllm_log_prob_engine.load_weights([("model.not_a_layer.weight", torch.zeros(4))])
    q_only = [("model.layers.0.self_attn.q_proj.weight", torch.zeros(128, 128))]
    with pytest.raises(ValueError, match="fused 'qkv_proj'"):
        vllm_log_prob_engine.load_weights(q_only)
    with pytest.raises(ValueError, match="no tensors"):
        vllm_log_prob_engine.load_weights([])
    with pytest.raises(ValueError, match="has shape"):
        vllm_log_prob_engine.load_weights([("model.norm.weight", torch.ones(64))])

    assert vllm_log_prob_engine.log_probs([[5, 6]], [[7, 8]], top_k=0) == before
    assert vllm_log_prob_engine.weight_norm() == norm


def test_an_unknown_vllm_config_key_is_a_value_error(tiny_model_path, vllm_test_config):
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    with pytest.raises(ValueError, match="max_model_lenn"):
        VLLMSamplingEngine(vllm_test_config(tiny_model_path, max_model_lenn=64))


def test_close_frees_the_engine_memory(tiny_model_path, vllm_test_config):
    import psutil

    from arctic_rl_engines.vllm_log_prob import VLLMLogProbEngine

    kv_bytes = 512 << 20
    engine = VLLMLogProbEngine(vllm_test_config(tiny_model_path, kv_cache_memory_bytes=kv_bytes))
    print(f"vLLM log-prob engine started in {engine.start_seconds:.1f} s")
    engine.log_probs([[5]], [[6]])
    rss_open = psutil.Process().memory_info().rss
    engine.close()
    rss_closed = psutil.Process().memory_info().rss

    assert rss_open - rss_closed > kv_bytes // 2
    with pytest.raises(EngineError, match="closed"):
        engine.log_probs([[5]], [[6]])
    engine.close()  # closing twice is harmless


MULTIPROCESS_PROGRAM = """
import math
import torch, transformers
from arctic_rl_engines.vllm_log_prob import VLLMLogProbEngine


def main(path):
    engine = VLLMLogProbEngine(engine_config(path, 256 << 20, log_prob_gpus=1))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.05)
    engine.load_weights(model.state_dict().items(), bucket_bytes=300_000)
    ids = list(range(20, 40))
    got = engine.log_probs([ids[:4]], [ids[4:]], top_k=0)[0]["log_probs"]
    with torch.no_grad():
        table = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    want = [float(table[i - 1, ids[i]]) for i in range(4, len(ids))]
    norm = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()))
    out = {
        "in_process": engine.in_process, "buckets": engine.last_load["buckets"],
        "max_diff": max(abs(a - b) for a, b in zip(got, want)),
        "norm": engine.weight_norm(), "expected_norm": norm, "start_seconds": engine.start_seconds,
    }
    engine.close()
    return out
"""


def test_multiprocess_engine_takes_weights_as_safetensors_buckets(tiny_model_path, tmp_path):
    result = run_engine_program(MULTIPROCESS_PROGRAM, tiny_model_path, tmp_path)  # in_process False
    assert result["buckets"] > 1
    assert result["max_diff"] < TOLERANCE
    assert result["norm"] == pytest.approx(result["expected_norm"], rel=1e-12)
