"""Bad data against the real engines: each is a 4xx with a message; no job dies, no weight moves.

Every case goes through the real client (safetensors frames for tensor-bearing operations) or
raw HTTP for what the client would refuse to build. After each, all three jobs still run and
the weight norm of every job is exactly what it was. A refused training request must also
leave no trace for later: a ``step()`` after it gives the same weights as a twin of the
job that never saw it (the same job restored from a checkpoint taken just before).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from arctic_platform.rl.errors import ServerError

pytestmark = pytest.mark.slow

VOCAB_LIMIT = 10**6  # far outside the tiny model's vocabulary (~512)
CONTEXT = 1024  # the tiny model's max_position_embeddings
GOOD_ROW = [1, 5, 6, 7, 8]
TWIN_BATCH = {"input_ids": [GOOD_ROW, [1, 9, 10, 11, 12]], "loss_mask": [[0, 1, 1, 1, 1]] * 2}
TWIN_LR = 1e-2  # large enough that one step moves the tiny model's weight norm


def _refused(live, call: Callable[[], Any], status: int, *words: str) -> str:
    """Run ``call``; it must fail with ``status`` and a message holding ``words``."""
    norms = live.client.weight_norm()
    with pytest.raises(ServerError) as info:
        call()
    message = info.value.message
    assert info.value.status_code == status, message
    for word in words:
        assert word.lower() in message.lower(), message
    live.assert_healthy()
    assert live.client.weight_norm() == norms, "a refused request changed weights"
    return message


def _refused_and_no_trace(live, call: Callable[[], Any], status: int, *words: str) -> str:
    """``_refused`` on the training job, then: ``fwd_bwd`` + ``step()`` on a good batch gives
    exactly the weights of a twin that never saw ``call`` (restored from a checkpoint taken
    just before it), so the refused request left no gradient or state behind."""
    client = live.client
    # a checkpoint holds no pending gradient: apply any an earlier test (the API fuzzer) left,
    # so the live job and its checkpoint are the same state before the refused request
    client.step()
    before = client.save_checkpoint(tag=f"twin-{uuid.uuid4().hex[:8]}")
    message = _refused(live, call, status, *words)
    client.fwd_bwd(TWIN_BATCH, "cross_entropy")
    client.step(learning_rate=TWIN_LR)
    seen = client.weight_norm()["training"]
    client.load_checkpoint(path=before)
    start = client.weight_norm()["training"]
    client.fwd_bwd(TWIN_BATCH, "cross_entropy")
    client.step(learning_rate=TWIN_LR)
    twin = client.weight_norm()["training"]
    assert twin != start, "the good step moved no weight: the comparison would prove nothing"
    assert seen == twin, f"a refused request left a trace: {seen!r} after a step, twin {twin!r}"
    return message


# --- training batches (fwd_bwd, fwd_no_grad) ------------------------------------------------

BAD_BATCHES = {
    "token id outside the vocabulary": (
        {"input_ids": [[1, 2, VOCAB_LIMIT]], "advantages": [1.0]},
        ("vocabulary", "input_ids[0]"),
    ),
    "negative token id": ({"input_ids": [[1, -3, 2]], "advantages": [1.0]}, ("vocabulary",)),
    "sequence longer than the context": (
        {"input_ids": [[1] * (CONTEXT + 1)], "advantages": [1.0]},
        ("context", str(CONTEXT)),
    ),
    "ragged loss_mask": (
        {"input_ids": [GOOD_ROW, [1, 2]], "loss_mask": [[0, 1, 1, 1, 1], [0, 1, 1]]},
        ("loss_mask[1]",),
    ),
    "per-token advantages of the wrong length": (
        {"input_ids": [GOOD_ROW], "advantages": [[1.0, 2.0]]},
        ("advantages[0]",),
    ),
    "fewer old_log_probs rows than sequences": (
        {"input_ids": [GOOD_ROW, GOOD_ROW], "old_log_probs": [[0.0] * 5], "advantages": [1, 1]},
        ("old_log_probs",),
    ),
    "NaN advantage": ({"input_ids": [GOOD_ROW], "advantages": [float("nan")]}, ("nan",)),
    "infinite per-token advantage": (
        {"input_ids": [GOOD_ROW], "advantages": [[0.0, 1.0, float("inf"), 1.0, 1.0]]},
        ("advantages[0]",),
    ),
    "NaN old log-prob": (
        {"input_ids": [GOOD_ROW], "old_log_probs": [[0.0, float("nan"), 0, 0, 0]]},
        ("old_log_probs[0]",),
    ),
    "empty batch": ({"input_ids": []}, ("empty",)),
    "empty sequence": ({"input_ids": [[]]}, ("input_ids[0]",)),
    "mask that trains no token": (
        {"input_ids": [GOOD_ROW], "loss_mask": [[0, 0, 0, 0, 0]]},
        ("loss_mask",),
    ),
    "unknown field": ({"input_ids": [GOOD_ROW], "rewards": [1.0]}, ("rewards",)),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_bad_fwd_bwd_batch_is_a_422_and_changes_nothing(live, case):
    batch, words = BAD_BATCHES[case]
    _refused_and_no_trace(live, lambda: live.client.fwd_bwd(batch), 422, *words)


def test_a_bad_fwd_no_grad_batch_is_a_422_on_the_training_job(live):
    batch = {"input_ids": [[1, 2, VOCAB_LIMIT]]}
    _refused_and_no_trace(live, lambda: live.client.fwd_no_grad(batch), 422, "vocabulary")


def test_unknown_loss_and_bad_loss_config_are_422s(live):
    batch = {"input_ids": [GOOD_ROW], "advantages": [1.0]}
    _refused_and_no_trace(live, lambda: live.client.fwd_bwd(batch, loss_fn="nope"), 422, "nope")
    _refused_and_no_trace(
        live,
        lambda: live.client.fwd_bwd(batch, loss_config={"eps_clip": -1.0}),
        422,
        "loss_config",
        "-1.0",
    )


def test_a_negative_or_nan_learning_rate_is_a_422_and_no_step_is_taken(live):
    step = live.client.transport.call("get_job", {"job_id": live.job_ids["training"]})
    for lr in (-1e-3, 0.0):
        _refused(live, lambda lr=lr: live.client.step(learning_rate=lr), 422, "learning_rate")
    with live.http() as http:  # NaN is not JSON; Python's reader takes the literal
        answer = http.post(
            "/step",
            content=b'{"job_id": %d, "learning_rate": NaN}' % live.job_ids["training"],
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 422 and "learning_rate" in answer.json()["message"]
    assert live.client.transport.call("get_job", {"job_id": live.job_ids["training"]}) == step


# --- generation -----------------------------------------------------------------------------

BAD_GENERATE = {
    "n=0": (["1 + 2 ="], {"n": 0}, ("n",)),
    "n of a billion": (["1 + 2 ="], {"n": 10**9}, ("'n'", "4096")),
    "prompts x n past the per-request limit": (["7"] * 20_000, {"n": 4}, ("80000", "split")),
    "negative max_tokens": (["1 + 2 ="], {"max_tokens": -5}, ("max_tokens",)),
    "NaN temperature": (["1 + 2 ="], {"temperature": float("nan")}, ("temperature",)),
    "unknown sampling key": (["1 + 2 ="], {"beam_width": 4}, ("beam_width",)),
    "prompt token outside the vocabulary": ([[1, VOCAB_LIMIT]], {}, ("vocabulary",)),
    "prompt of thousands of tokens": ([[5] * 3000], {"max_tokens": 4}, ("max_model_len",)),
    "text prompt of thousands of tokens": (["7 " * 3000], {"max_tokens": 4}, ("max_model_len",)),
    "empty token prompt": ([[]], {}, ("prompts[0]",)),
    "min_tokens over max_tokens": (["x"], {"min_tokens": 9, "max_tokens": 2}, ("min_tokens",)),
}


@pytest.mark.parametrize("case", sorted(BAD_GENERATE))
def test_a_bad_generate_request_is_a_422_and_the_sampler_keeps_serving(live, case):
    prompts, params, words = BAD_GENERATE[case]
    _refused(live, lambda: live.client.generate(prompts, params), 422, *words)


def test_no_prompts_at_all_is_a_422_naming_prompts(live):
    with live.http() as http:
        answer = http.post("/generate", json={"job_id": live.job_ids["sampling"], "prompts": []})
    assert answer.status_code == 422 and "prompts" in answer.json()["message"]
    live.assert_healthy()


def test_more_tokens_than_the_context_holds_is_refused_or_cut_at_the_context(live):
    prompt = [5] * (CONTEXT - 8)
    try:
        out = live.client.generate([prompt], {"max_tokens": 10**6, "temperature": 0.0})
    except ServerError as exc:
        assert exc.status_code == 422 and "max" in exc.message.lower()
    else:
        completion = out["outputs"][0]["completions"][0]
        assert len(prompt) + len(completion["token_ids"]) <= CONTEXT
    live.assert_healthy()


# --- log-probs and weight sync --------------------------------------------------------------

BAD_LOG_PROBS = {
    "completion token outside the vocabulary": ([[1, 2]], [[VOCAB_LIMIT]], ("vocabulary",)),
    "prompt and completion past the context": ([[1] * 600], [[2] * 600], ("max_model_len",)),
    "more prompts than completions": ([[1, 2], [3, 4]], [[5]], ("completions",)),
    "empty prompt": ([[]], [[5]], ("prompts[0]",)),
}


@pytest.mark.parametrize("case", sorted(BAD_LOG_PROBS))
def test_a_bad_log_probs_request_is_a_422(live, case):
    prompts, completions, words = BAD_LOG_PROBS[case]
    _refused(live, lambda: live.client.log_probs(prompts, completions), 422, *words)


def test_a_sync_onto_the_training_job_itself_is_a_409_and_moves_no_weights(live):
    ids = live.job_ids
    payload = {"training_job_id": ids["training"], "sampling_job_ids": [ids["training"]]}
    _refused(live, lambda: live.client.transport.call("sync_weights", payload), 409, "sampling")


def test_a_sync_listing_thousands_of_job_ids_is_a_422_not_a_server_error(live):
    ids = live.job_ids
    payload = {"training_job_id": ids["training"], "sampling_job_ids": [ids["sampling"]] * 5000}
    call = live.client.transport.call
    _refused(live, lambda: call("sync_weights", payload), 422, "sampling_job_ids", "256")
    norms = live.client.transport.call("weight_norm", {"job_ids": [ids["sampling"]] * 200})
    assert list(norms["norms"]) == [str(ids["sampling"])]


# --- job creation -------------------------------------------------------------------------


@pytest.mark.parametrize("colocate", [False, True])
def test_initialize_asking_for_more_gpus_than_the_cluster_has_is_a_422_at_once(live, colocate):
    with live.http() as http:
        gpus = int(http.get("/status").json()["cluster"]["gpus"])
        before = set(live.states())
        # colocated: the largest role sets the bundles (training here); else the job's own count
        field = "training_gpus" if colocate else "sampling_gpus"
        config = {"model_name": live.client.config.model_name, "colocate": colocate}
        config.update(training_gpus=1, sampling_gpus=1, log_prob_gpus=0)
        config[field] = gpus + 1
        answer = http.post("/initialize", json={"job_type": "sampling", "config": config})
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert f"{field}={gpus + 1}" in message and f"the {gpus} GPUs the Ray cluster has" in message
    assert set(live.states()) == before, "a refused initialize made a job"
    live.assert_healthy()
