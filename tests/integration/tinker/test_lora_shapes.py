"""Two LoRA shapes side by side on one Tinker server, on a tied-embedding Qwen2 base, through
the real ``tinker`` SDK (issue 33 items 1 and 2).

The server has two (logical) GPUs and each LoRA pool takes one (``ARCTIC_RL_TINKER_POOL_GPUS``
default): a rank-8 model with the SDK's default targets (``train_unembed``: ``lm_head``, which
vLLM's Qwen2 class did not serve) and a rank-32 model without the MLP train and sample at once,
each sampler answering with its own trainer's log-probs; a third shape finds no GPU and is
refused at once with a 409 naming the pools that hold them, the two pools still serving.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow

SENTENCES = ["12 + 30 = 42", "the sum of digits", "write a number 123"]
SHAPES = {
    "rank 8, default targets": {"rank": 8},
    "rank 32, no MLP": {"rank": 32, "train_mlp": False},
}


@pytest.fixture(scope="module")
def tied_qwen2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random Qwen2 with tied input and output embeddings (as Qwen3-0.6B has)."""
    from arctic_platform.rl.testing import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-qwen2-tied"
    return str(build_tiny_model(path, arch="qwen2", tie_word_embeddings=True))


@pytest.fixture(scope="module")
def shaped(service, tied_qwen2):
    """The two training clients (each shape a pool of its own), by shape name."""
    return {
        name: service.create_lora_training_client(base_model=tied_qwen2, **kwargs)
        for name, kwargs in SHAPES.items()
    }


def _datum(tokens):
    import tinker

    targets = tokens[1:]
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=targets, dtype="int64", shape=[len(targets)])
        },
    )


def _trainer_log_probs(training, tokens):
    out = training.forward([_datum(tokens)], "cross_entropy").result(timeout=600)
    return out.loss_fn_outputs[0]["logprobs"].to_numpy().astype(np.float64)


def _scored(sampler, tokens):
    import tinker

    lps = sampler.compute_logprobs(tinker.ModelInput.from_ints(tokens)).result(timeout=600)
    return np.asarray(lps[1:], dtype=np.float64)


def test_two_shapes_train_and_sample_side_by_side_each_as_its_trainer(shaped, service, tied_qwen2):
    import tinker

    adam = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    base = service.create_sampling_client(base_model=tied_qwen2)
    probes = {}
    for name, training in shaped.items():
        info = training.get_info()
        assert info.is_lora and info.lora_rank == SHAPES[name]["rank"], name
        tok = training.get_tokenizer()
        data = [_datum(tok.encode(s)) for s in SENTENCES]
        for _ in range(3):  # the two models' steps interleave on the server
            training.forward_backward(data, "cross_entropy")
            training.optim_step(adam)
        probes[name] = tok.encode(SENTENCES[0])
    for name, training in shaped.items():
        sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
        prompt = probes[name]
        trainer = _trainer_log_probs(training, prompt)
        served, untrained = _scored(sampler, prompt), _scored(base, prompt)
        gap, moved = np.max(np.abs(served - trainer)), np.max(np.abs(untrained - trainer))
        print(f"{name}: sampler vs trainer {gap:.2e}, trained vs base {moved:.3f}")
        assert gap <= 1e-4, name
        assert moved > 1e-3, name
        params = tinker.SamplingParams(max_tokens=6, temperature=1.0, seed=1)
        result = sampler.sample(tinker.ModelInput.from_ints(prompt), 2, params).result(600)
        for seq in result.sequences:  # sampled log-probs are the trainer's too
            tail = _trainer_log_probs(training, prompt + list(seq.tokens))[-len(seq.tokens) :]
            assert np.max(np.abs(tail - np.asarray(seq.logprobs))) <= 1e-4, name


def _tiny_gpt2(path) -> str:
    """A random one-layer GPT-2 (its attention is ``c_attn``/``c_proj``, its MLP ``c_fc``):
    none of the modules Tinker's LoRA switches name."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(path)
    return str(path)


def test_a_third_shape_is_refused_at_once_naming_the_pools_that_hold_the_gpus(
    shaped, tinker_server, tied_qwen2, tmp_path
):
    with httpx.Client(
        base_url=tinker_server.base_url, headers={"X-API-Key": tinker_server.token}, timeout=60
    ) as raw:
        session = raw.post("/api/v1/create_session", json={}).json()["session_id"]
        try:
            # a base model without the targeted modules: a 422 naming those it has, at once
            gpt2 = _tiny_gpt2(tmp_path / "tiny-gpt2")
            body = {"session_id": session, "model_seq_id": 1, "base_model": gpt2}
            answer = raw.post("/api/v1/create_model", json={**body, "lora_config": {"rank": 8}})
            assert answer.status_code == 422, answer.text
            error = answer.json()["error"]
            assert "has no ['q_proj'" in error and "'c_attn'" in error, error
            body = {"session_id": session, "model_seq_id": 0, "base_model": tied_qwen2}
            answer = raw.post("/api/v1/create_model", json={**body, "lora_config": {"rank": 16}})
            # refused in the call itself: no request id to poll, nothing waits for placement
            assert answer.status_code == 409, answer.text
            error = answer.json()["error"]
            assert "rank 16" in error and "rank 8" in error and "rank 32" in error, error
            assert "ARCTIC_RL_TINKER_POOL_GPUS" in error
        finally:
            raw.post(f"/api/v1/sessions/{session}/finish")
    for training in shaped.values():  # both pools still serve
        tok = training.get_tokenizer()
        assert np.all(np.isfinite(_trainer_log_probs(training, tok.encode(SENTENCES[1]))))
