"""The real ``tinker`` SDK against ``arctic-rl serve --transport tinker`` (tiny model, CPU).

In file order: step-0 log-probs of trainer and sampler agree, a supervised cross-entropy
loop lowers its loss, AdamParams and checkpoints round-trip, and bad input is a 4xx in the
SDK's error shape with the server and the model's jobs still serving.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPT = "12 + 30 ="
SENTENCES = ["12 + 30 = 42", "7 + 5 = 12", "the sum of digits", "write a number 123"]


def _tokenizer(training):
    return training.get_tokenizer()


def _datum(tokens, weights):
    import tinker

    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(
                data=list(tokens[1:]), dtype="int64", shape=[len(tokens) - 1]
            ),
            "weights": tinker.TensorData(
                data=list(weights[1:]), dtype="float32", shape=[len(tokens) - 1]
            ),
        },
    )


def test_get_info_says_full_fine_tuning(training, tinker_server):
    info = training.get_info()
    assert info.is_lora is False
    assert info.model_data.model_name == tinker_server.model


def test_step0_trainer_log_probs_equal_the_samplers(training):
    import tinker

    tok = _tokenizer(training)
    prompt = tok.encode(PROMPT)
    sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    result = sampler.sample(tinker.ModelInput.from_ints(prompt), 2, params).result(timeout=600)
    data, sampled = [], []
    for seq in result.sequences:
        assert len(seq.tokens) > 0 and len(seq.logprobs) == len(seq.tokens)
        tokens = prompt + list(seq.tokens)
        data.append(_datum(tokens, [0.0] * len(prompt) + [1.0] * len(seq.tokens)))
        sampled.append(np.asarray(seq.logprobs))
    out = training.forward_backward(data, "cross_entropy").result(timeout=600)
    assert "loss:sum" in out.metrics
    for seq_lps, output, datum in zip(sampled, out.loss_fn_outputs, data, strict=True):
        trainer = output["logprobs"].to_numpy()
        assert trainer.shape == (datum.model_input.length,)
        tail = trainer[-len(seq_lps) :]
        assert np.max(np.abs(tail - seq_lps)) < 1e-3, (tail, seq_lps)
    # compute_logprobs: the sampler's prompt log-probs of the same tokens
    first = prompt + list(result.sequences[0].tokens)
    scored = sampler.compute_logprobs(tinker.ModelInput.from_ints(first)).result(timeout=600)
    assert scored[0] is None and len(scored) == len(first)
    trainer = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.max(np.abs(np.asarray(scored[1:], dtype=np.float64) - trainer)) < 1e-3


def test_supervised_cross_entropy_loop_lowers_the_loss(training):
    import tinker

    tok = _tokenizer(training)
    rows = [tok.encode(s) for s in SENTENCES]
    data = [_datum(r, [1.0] * len(r)) for r in rows]
    adam = tinker.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8)
    losses = []
    for _ in range(8):
        fwd = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(adam)
        losses.append(fwd.result(timeout=600).metrics["loss:sum"])
        assert step.result(timeout=600).metrics is not None
    print("cross-entropy loss:sum per step:", [round(x, 3) for x in losses])
    assert losses[-1] < 0.8 * losses[0]
    # forward only: the same loss definition, no step taken
    again = training.forward(data, "cross_entropy").result(timeout=600)
    assert again.metrics["loss:sum"] < losses[0]


def test_save_and_load_weights_round_trip(training):
    tok = _tokenizer(training)
    data = [_datum(tok.encode(SENTENCES[0]), [1.0] * len(tok.encode(SENTENCES[0])))]
    saved = training.save_state("ckpt-a").result(timeout=600)
    assert saved.path.startswith("tinker://")
    before = training.forward(data, "cross_entropy").result(timeout=600).metrics["loss:sum"]
    training.load_state_with_optimizer(saved.path).result(timeout=600)
    after = training.forward(data, "cross_entropy").result(timeout=600).metrics["loss:sum"]
    assert abs(before - after) < 1e-4


def test_a_sampler_on_replaced_weights_is_refused_with_a_clear_error(training):
    import tinker

    tok = _tokenizer(training)
    prompt = tinker.ModelInput.from_ints(tok.encode(PROMPT))
    params = tinker.SamplingParams(max_tokens=2)
    old = training.save_weights_and_get_sampling_client().result(timeout=600)
    new = training.save_weights_and_get_sampling_client().result(timeout=600)
    assert len(new.sample(prompt, 1, params).result(timeout=600).sequences) == 1
    with pytest.raises(tinker.RequestFailedError, match="newer save_weights_for_sampler"):
        old.sample(prompt, 1, params).result(timeout=600)


def test_concurrent_samples_of_one_sampler_each_answer_their_own_prompt(training):
    import tinker

    tok = _tokenizer(training)
    sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
    params = tinker.SamplingParams(max_tokens=4, temperature=1.0)
    prompts = [tok.encode(s) for s in SENTENCES]
    futures = [  # sent together: the server may answer them from one generate
        sampler.sample(tinker.ModelInput.from_ints(p), 2, params, include_prompt_logprobs=True)
        for p in prompts
    ]
    for prompt, future in zip(prompts, futures, strict=True):
        result = future.result(timeout=600)
        assert len(result.sequences) == 2
        assert len(result.prompt_logprobs) == len(prompt)
        alone = sampler.compute_logprobs(tinker.ModelInput.from_ints(prompt)).result(timeout=600)
        got = np.asarray(result.prompt_logprobs[1:], dtype=np.float64)
        assert np.max(np.abs(got - np.asarray(alone[1:], dtype=np.float64))) < 1e-3


# --- bad input ----------------------------------------------------------------------------

FAR_SEQ = 10**9  # raw requests must not take a seq_id the SDK's client will use


def _proto(model_id, tokens, targets, loss_fn="cross_entropy"):
    import tinker
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=targets, dtype="int64", shape=[len(targets)])
        },
    )
    request = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(data=[datum], loss_fn=loss_fn),
        model_id=model_id,
        seq_id=FAR_SEQ,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


@pytest.fixture()
def raw(tinker_server):
    with httpx.Client(
        base_url=tinker_server.base_url,
        headers={"X-API-Key": tinker_server.token},
        timeout=60,
    ) as client:
        yield client


def _refused(answer, status=None):
    assert 400 <= answer.status_code < 500, answer.text
    if status is not None:
        assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["category"] == "user" and body["error"]
    return body["error"]


PROTO_HEADERS = {"Content-Type": "application/x-protobuf"}


def test_a_wrong_or_missing_key_is_a_401_that_never_echoes_the_key(tinker_server):
    for headers in ({}, {"X-API-Key": "tml-wrong"}):
        answer = httpx.post(
            f"{tinker_server.base_url}/api/v1/create_session", json={}, headers=headers
        )
        assert answer.status_code == 401
        assert tinker_server.token not in answer.text
        assert "tml-wrong" not in answer.text
    assert tinker_server.token not in tinker_server.log.read_text()


def test_malformed_protobuf_is_a_4xx(raw):
    error = _refused(
        raw.post("/api/v1/forward_backward", content=b"\xff\x00garbage", headers=PROTO_HEADERS)
    )
    assert "ForwardBackwardRequest" in error


def test_an_unknown_model_id_is_a_404(raw):
    body = _proto("no-such-model", [1, 2, 3], [2, 3, 4])
    error = _refused(raw.post("/api/v1/forward_backward", content=body, headers=PROTO_HEADERS), 404)
    assert "no-such-model" in error


def test_an_unknown_session_id_is_a_404(raw, tinker_server):
    answer = raw.post(
        "/api/v1/create_model",
        json={
            "session_id": "no-such-session",
            "model_seq_id": 0,
            "base_model": tinker_server.model,
        },
    )
    assert "no-such-session" in _refused(answer, 404)


def test_targets_and_inputs_of_different_length_are_a_4xx(raw, training):
    body = _proto(training.model_id, [1, 2, 3, 4], [2, 3])
    error = _refused(raw.post("/api/v1/forward_backward", content=body, headers=PROTO_HEADERS))
    assert "target_tokens has 2 entries" in error


def test_an_unknown_loss_is_a_4xx(raw, training):
    body = _proto(training.model_id, [1, 2, 3], [2, 3, 4], loss_fn="no_such_loss")
    error = _refused(raw.post("/api/v1/forward_backward", content=body, headers=PROTO_HEADERS))
    assert "no_such_loss" in error


def test_an_unknown_request_id_is_a_404(raw):
    _refused(raw.post("/api/v1/retrieve_future", json={"request_id": "nope"}), 404)


def test_after_the_bad_inputs_the_server_and_the_models_jobs_still_serve(raw, training):
    import tinker

    assert raw.get("/api/v1/healthz").status_code == 200
    tok = _tokenizer(training)
    tokens = tok.encode(SENTENCES[1])
    out = training.forward([_datum(tokens, [1.0] * len(tokens))], "cross_entropy").result(
        timeout=600
    )
    assert np.isfinite(out.metrics["loss:sum"])
    sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
    params = tinker.SamplingParams(max_tokens=4, temperature=1.0)
    result = sampler.sample(tinker.ModelInput.from_ints(tokens), 1, params).result(timeout=600)
    assert len(result.sequences) == 1
