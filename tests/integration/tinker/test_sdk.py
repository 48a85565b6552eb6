"""The real ``tinker`` SDK against ``arctic-rl serve --transport tinker`` (tiny model, CPU).

The model is a rank-8 LoRA adapter. In file order: get_info says so, step-0 log-probs of
trainer and sampler agree, a supervised cross-entropy loop lowers its loss, save_state ->
more steps -> load_state(_with_optimizer) restores what was saved, the sampler on a new path
matches the trainer and not the base, an older path keeps its version, and bad input (LoRA
settings and base models included) is a 4xx in the SDK's error shape with the server and the
model's jobs still serving.
"""

from __future__ import annotations

import time

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


def test_get_info_says_lora_and_its_rank(training, tinker_server):
    info = training.get_info()
    assert info.is_lora is True
    assert info.lora_rank == 8
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


def test_importance_sampling_returns_the_sampler_trainer_mismatch(training):
    """The sampler's log-probs (Tinker's ``logprobs``) against the trainer's on the same
    weights: Tinker's ``kl_sample_train_v1`` and our k3 come back in the answer's metrics, at
    the level of two fp32 engines agreeing (forward only: nothing is trained)."""
    import tinker

    tok = _tokenizer(training)
    prompt = tok.encode(PROMPT)
    sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    result = sampler.sample(tinker.ModelInput.from_ints(prompt), 2, params).result(timeout=600)
    data = []
    for seq in result.sequences:
        tokens = prompt + list(seq.tokens)
        n = len(tokens) - 1
        sampled = [0.0] * (len(prompt) - 1) + list(seq.logprobs)
        inputs = {
            "target_tokens": tinker.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
            "logprobs": tinker.TensorData(data=sampled, dtype="float32", shape=[n]),
            "advantages": tinker.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
            "weights": tinker.TensorData(
                data=[0.0] * (len(prompt) - 1) + [1.0] * len(seq.tokens), dtype="float32",
                shape=[n],
            ),
        }  # fmt: skip
        data.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                 loss_fn_inputs=inputs))  # fmt: skip
    out = training.forward(data, "importance_sampling").result(timeout=600)
    print("tinker importance_sampling metrics:", out.metrics)
    assert abs(out.metrics["kl_sample_train_v1:mean"]) < 1e-3
    assert 0.0 <= out.metrics["mismatch_k3:mean"] < 1e-4
    assert out.metrics["mismatch_ratio:mean"] == pytest.approx(1.0, abs=1e-3)
    low, high = out.metrics["mismatch_ratio:min"], out.metrics["mismatch_ratio:max"]
    assert 1 - 1e-3 < low <= high < 1 + 1e-3


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


def _forward_log_probs(training, data):
    out = training.forward(data, "cross_entropy").result(timeout=600)
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def _step_then_log_probs(training, data, adam):
    """One fwd_bwd + optim_step on ``data``; the trainer's log-probs of ``data`` after it."""
    fwd = training.forward_backward(data, "cross_entropy")
    step = training.optim_step(adam)
    fwd.result(timeout=600), step.result(timeout=600)
    return _forward_log_probs(training, data)


def _saved_then_stepped(training, name):
    """A save_state after a step (so Adam has moments), the first step after it, then two more
    steps; the path, the data, Adam's params and the log-probs at the save and after its first
    step."""
    import tinker

    tok = _tokenizer(training)
    rows = [tok.encode(s) for s in SENTENCES]
    data = [_datum(r, [1.0] * len(r)) for r in rows]
    adam = tinker.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8)
    _step_then_log_probs(training, data, adam)
    saved = training.save_state(name).result(timeout=600)
    assert saved.path.startswith("tinker://")
    at_save = _forward_log_probs(training, data)
    first_after_save = _step_then_log_probs(training, data, adam)
    for _ in range(2):  # the weights and Adam's moments move on
        moved = _step_then_log_probs(training, data, adam)
    assert np.max(np.abs(moved - at_save)) > 1e-3
    return saved.path, data, adam, at_save, first_after_save


def test_load_state_with_optimizer_restores_the_weights_and_adams_moments(training):
    path, data, adam, at_save, first_after_save = _saved_then_stepped(training, "ckpt-a")
    training.load_state_with_optimizer(path).result(timeout=600)
    assert np.max(np.abs(_forward_log_probs(training, data) - at_save)) < 1e-6
    again = _step_then_log_probs(training, data, adam)
    assert np.max(np.abs(again - first_after_save)) < 1e-6


def test_load_state_restores_the_weights_with_a_fresh_optimizer(training):
    path, data, adam, at_save, first_after_save = _saved_then_stepped(training, "ckpt-b")
    training.load_state(path).result(timeout=600)
    assert np.max(np.abs(_forward_log_probs(training, data) - at_save)) < 1e-6
    fresh = _step_then_log_probs(training, data, adam)  # Adam's first step: another step
    assert np.max(np.abs(fresh - first_after_save)) > 1e-4


def test_the_sampler_on_a_new_path_matches_the_trainer_and_not_the_base(
    training, service, tinker_server
):
    import tinker

    tok = _tokenizer(training)
    rows = [tok.encode(s) for s in SENTENCES]
    adam = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    data = [_datum(r, [1.0] * len(r)) for r in rows]
    for _ in range(3):
        training.forward_backward(data, "cross_entropy")
        training.optim_step(adam).result(timeout=600)
    path = training.save_weights_for_sampler("after-3").result(timeout=600).path
    sampler = service.create_sampling_client(model_path=path)
    base = service.create_sampling_client(base_model=tinker_server.model)
    prompt = tok.encode(SENTENCES[0])
    trainer = _forward_log_probs(training, [_datum(prompt, [1.0] * len(prompt))])

    def scored(client):
        lps = client.compute_logprobs(tinker.ModelInput.from_ints(prompt)).result(timeout=600)
        return np.asarray(lps[1:], dtype=np.float64)

    assert np.max(np.abs(scored(sampler) - trainer)) < 1e-4
    assert np.max(np.abs(scored(base) - trainer)) > 1e-3


def test_a_sampler_on_an_older_path_keeps_answering_with_that_version(training):
    import tinker

    tok = _tokenizer(training)
    tokens = tok.encode(SENTENCES[2])
    prompt = tinker.ModelInput.from_ints(tokens)
    adam = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    old = training.save_weights_and_get_sampling_client().result(timeout=600)
    before = np.asarray(old.compute_logprobs(prompt).result(timeout=600)[1:], dtype=np.float64)
    training.forward_backward([_datum(tokens, [1.0] * len(tokens))], "cross_entropy")
    training.optim_step(adam).result(timeout=600)
    new = training.save_weights_and_get_sampling_client().result(timeout=600)
    newer = np.asarray(new.compute_logprobs(prompt).result(timeout=600)[1:], dtype=np.float64)
    still = np.asarray(old.compute_logprobs(prompt).result(timeout=600)[1:], dtype=np.float64)
    assert np.max(np.abs(newer - before)) > 1e-3
    assert np.max(np.abs(still - before)) < 1e-6  # the old path serves its own version
    params = tinker.SamplingParams(max_tokens=2)
    assert len(old.sample(prompt, 1, params).result(timeout=600).sequences) == 1


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


def _create_model(raw, base_model, lora_config):
    session = raw.post("/api/v1/create_session", json={}).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": base_model}
    return raw.post("/api/v1/create_model", json={**body, "lora_config": lora_config})


def test_a_lora_rank_above_the_samplers_limit_is_a_4xx(raw, tinker_server):
    error = _refused(_create_model(raw, tinker_server.model, {"rank": 1024}))
    assert "1024" in error and "512" in error


def test_a_lora_config_that_trains_nothing_is_a_4xx(raw, tinker_server):
    off = {"rank": 8, "train_mlp": False, "train_attn": False, "train_unembed": False}
    assert "trains nothing" in _refused(_create_model(raw, tinker_server.model, off))


def test_a_base_model_that_does_not_exist_is_a_4xx(raw, tmp_path):
    missing = str(tmp_path / "no-such-model")
    assert "no-such-model" in _refused(_create_model(raw, missing, {"rank": 8}))
    assert "not-an-org/not-a-model" in _refused(
        _create_model(raw, "not-an-org/not-a-model", {"rank": 8})
    )  # HF_HUB_OFFLINE: not in the cache


# --- a refused request frees its place in the model's order -----------------------------


def _fwd_proto(model_id, seq_id, tokens, inputs=None, loss_fn="cross_entropy"):
    """A ForwardBackwardRequest of one datum: ``tokens`` with ``inputs`` (name -> (values,
    dtype)); target_tokens default to the tokens shifted by one."""
    import tinker
    from tinker.proto.request_conv import forward_backward_request_to_proto

    inputs = {"target_tokens": ([*tokens[1:], 1], "int64"), **(inputs or {})}
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            name: tinker.TensorData(data=values, dtype=dtype, shape=[len(values)])
            for name, (values, dtype) in inputs.items()
        },
    )
    request = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(data=[datum], loss_fn=loss_fn),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _outcome(raw, answer, hang=120.0):
    """The final answer of an accepted request (polled as the SDK does); a failure if it is
    still pending after ``hang`` seconds (a wedged model waits forever)."""
    assert answer.status_code == 200, answer.text
    request_id = answer.json()["request_id"]
    deadline = time.monotonic() + hang
    while time.monotonic() < deadline:
        got = raw.post("/api/v1/retrieve_future", json={"request_id": request_id})
        if "json" not in got.headers.get("content-type", "") or got.json() is None:
            return got
        if got.json().get("type") != "try_again":
            return got
    pytest.fail(f"request {request_id} still pending after {hang} s: the model is wedged")


def _ok(raw, answer):
    got = _outcome(raw, answer)
    assert got.status_code == 200, got.text
    assert "json" not in got.headers.get("content-type", "") or "error" not in (got.json() or {})
    return got


BAD_FORWARD_BACKWARD = {
    "targets of another length (parse time)": dict(
        tokens=[1, 2, 3, 4], inputs={"target_tokens": ([2, 3], "int64")}
    ),
    "a zero-length datum (parse time)": dict(tokens=[], inputs={"target_tokens": ([], "int64")}),
    "weights of another length (parse time)": dict(
        tokens=[1, 2, 3], inputs={"weights": ([1.0], "float32")}
    ),
    "an unknown loss (checked before queuing)": dict(tokens=[1, 2, 3], loss_fn="no_such_loss"),
    "NaN advantages (found by the engine)": dict(
        tokens=[1, 2, 3],
        inputs={
            "logprobs": ([-1.0, -1.0, -1.0], "float32"),
            "advantages": ([float("nan")] * 3, "float32"),
        },
        loss_fn="importance_sampling",
    ),
    "token ids out of the vocabulary (found by the engine)": dict(tokens=[1, 2, 10**6]),
}


def test_every_refused_request_frees_its_seq_id_for_the_models_next_ones(raw, tinker_server):
    """After each kind of refused request, the same model's next forward_backward and
    optim_step (consecutive seq_ids, as the SDK sends them) are answered."""
    created = _create_model(raw, tinker_server.model, {"rank": 8})
    model_id = _ok(raw, created).json()["model_id"]
    session = model_id.split(":")[0]
    try:
        _refusals_then_progress(raw, model_id, session)
    finally:  # its adapter leaves the pool now, not at the heartbeat timeout
        raw.post(f"/api/v1/sessions/{session}/finish")


def _refusals_then_progress(raw, model_id, session):
    """Each refused request at the model's next seq_id, then a forward_backward and an
    optim_step at the two after it: both must be answered."""
    adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    bad_json = {
        "/api/v1/optim_step": {"adam_params": {"learning_rate": -1.0}},
        "/api/v1/save_weights": {"path": "../escape"},
        "/api/v1/load_weights": {"path": "tinker://nobody/weights/none"},
    }
    seq = 1
    refusals = [("fwd", name, spec) for name, spec in BAD_FORWARD_BACKWARD.items()]
    refusals += [("json", path, body) for path, body in bad_json.items()]
    for kind, name, spec in refusals:
        raw.post("/api/v1/session_heartbeat", json={"session_id": session})
        if kind == "fwd":
            body = _fwd_proto(model_id, seq, **spec)
            answer = raw.post("/api/v1/forward_backward", content=body, headers=PROTO_HEADERS)
        else:
            answer = raw.post(name, json={"model_id": model_id, "seq_id": seq, **spec})
        if answer.status_code == 200:  # accepted, then failed in the engine: an error outcome
            failed = _outcome(raw, answer)
            assert "error" in failed.json(), (name, failed.text)
        else:
            _refused(answer)
        good = _fwd_proto(model_id, seq + 1, [1, 2, 3, 4])
        _ok(raw, raw.post("/api/v1/forward_backward", content=good, headers=PROTO_HEADERS))
        step = {"model_id": model_id, "seq_id": seq + 2, "adam_params": adam}
        _ok(raw, raw.post("/api/v1/optim_step", json=step))
        seq += 3


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
