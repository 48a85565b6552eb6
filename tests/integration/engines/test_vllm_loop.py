"""The vLLM sampling engine's request loop on CPU: concurrent generate calls share batches,
weights are swapped between steps (``drain`` and ``hotswap``), errors stay with their call.

The shared session engine serves these tests; every test that swaps weights puts the
original ones back. Ordering is made deterministic with ``loop.hold()`` (the loop neither
steps nor admits while held), never with sleeps or timing."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from engine_program import run_engine_program
from engine_reference import max_diff, reference_log_probs

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from arctic_platform.rl.errors import EngineError, InvalidRequestError  # noqa: E402

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # float32 vLLM vs float32 transformers, nats
WAIT = 120.0  # seconds any wait in these tests may take before it is a failure
PROMPT = [(7 * i) % 300 + 40 for i in range(140)]  # more than one KV block (128 on CPU)


@pytest.fixture
def new_model(hf_model: Any) -> Any:
    """Other weights: the checkpoint with Gaussian noise added."""
    generator = torch.Generator().manual_seed(21)
    model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture
def engine(vllm_sampling_engine: Any, hf_model: Any) -> Any:
    """The session engine; its original weights are loaded back after the test."""
    yield vllm_sampling_engine
    vllm_sampling_engine.swap_weights(hf_model.state_dict().items(), strategy="drain")


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


class Background:
    """``function()`` in a thread; ``result()`` joins it and returns or raises its outcome."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self._outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                self._outcome["value"] = function()
            except BaseException as exc:
                self._outcome["error"] = exc

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the call did not return"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def test_concurrent_generates_share_batches_and_each_gets_exactly_its_own_outputs(engine):
    calls = 6
    prompts = {i: [[40 + i, 41 + i, 42 + i], f"{i} + {i} ="] for i in range(calls)}
    params = {i: {"n": 2, "max_tokens": 12, "seed": 100 + i} for i in range(calls)}
    alone = {i: engine.generate(prompts[i], params[i]) for i in range(calls)}
    steps_before = engine.loop_stats()["steps"]

    with engine.loop.hold():
        running = {i: Background(lambda i=i: engine.generate(prompts[i], params[i])) for i in alone}
        wait_until("6 queued calls", lambda: engine.loop.counts()["queued_calls"] == calls)
    results = {i: call.result() for i, call in running.items()}

    assert results == alone  # each call: its own prompts, and the samples its seed gives alone
    batches = [(c, r) for step, c, r in engine.loop.stats.recent if step > steps_before]
    print(f"calls, requests per step: {batches}")
    assert batches[0] == (calls, 2 * calls)  # all six calls in the first step's batch
    assert len(batches) <= 12  # 6 calls x 12 tokens in at most 12 steps: one batch per token


def test_a_call_vllm_refuses_fails_alone_and_the_loop_keeps_serving(engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    good = [TokensPrompt(prompt_token_ids=[50, 51])]
    bad = [TokensPrompt(prompt_token_ids=[50]), TokensPrompt(prompt_token_ids=[10**9])]
    with engine.loop.hold():
        ok = engine.loop.submit(good, [SamplingParams(max_tokens=4)])
        refused = engine.loop.submit(bad, [SamplingParams(max_tokens=4)] * 2)

    # an out-of-vocabulary id is the caller's fault: vLLM's client error becomes a 422
    with pytest.raises(InvalidRequestError, match=r"vLLM refused a request.*out of vocabulary"):
        engine.loop.wait(refused, WAIT)
    assert len(engine.loop.wait(ok, WAIT)[0].outputs[0].token_ids) == 4
    assert engine.loop.counts()["running_requests"] == 0  # the refused call left nothing behind
    assert engine.generate([[50, 51]], {"max_tokens": 3})


def test_invalid_input_is_refused_before_anything_is_queued(engine):
    submitted = engine.loop_stats()["calls_submitted"]

    with pytest.raises(InvalidRequestError, match="temperature"):
        engine.generate([[50, 51]], {"temperature": -1})
    with pytest.raises(InvalidRequestError, match="hotswapp"):
        engine.swap_weights([], strategy="hotswapp")

    assert engine.loop_stats()["calls_submitted"] == submitted


def test_drain_swap_finishes_running_requests_on_old_weights_and_later_ones_use_new(
    engine, hf_model, new_model
):
    version = engine.weight_version
    long = Background(
        lambda: engine.generate([PROMPT], {"max_tokens": 300, "ignore_eos": True, "seed": 5})
    )
    wait_until("the long request to run", lambda: engine.loop.counts()["running_requests"] == 1)
    with engine.loop.hold():
        assert engine.loop.counts()["running_requests"] == 1
        swap = Background(
            lambda: engine.swap_weights(new_model.state_dict().items(), strategy="drain")
        )
        wait_until("the swap to be queued", lambda: engine.loop.counts()["tasks"] == 1)
        later = Background(lambda: engine.generate([PROMPT], {"max_tokens": 16, "seed": 6}))
        wait_until("the later call to be queued", lambda: engine.loop.counts()["queued_calls"])
    report = swap.result()
    first = long.result()[0]["completions"][0]
    second = later.result()[0]["completions"][0]

    assert report["strategy"] == "drain" and report["requests_in_flight"] == 0
    assert report["weight_version"] == version + 1
    assert len(first["token_ids"]) == 300
    assert (first["weight_version_start"], first["weight_version_end"]) == (version, version)
    assert (second["weight_version_start"], second["weight_version_end"]) == (version + 1,) * 2
    old_diff = max_diff(
        reference_log_probs(hf_model, PROMPT, first["token_ids"]), first["logprobs"]
    )
    # same prompt as the request that ran on the old weights: a stale cached block shows here
    new_diff = max_diff(
        reference_log_probs(new_model, PROMPT, second["token_ids"]), second["logprobs"]
    )
    print(f"drain: running request vs old weights {old_diff:.1e}, later vs new {new_diff:.1e}")
    assert old_diff < TOLERANCE and new_diff < TOLERANCE


def test_hotswap_mid_generation_reports_both_versions_and_later_requests_use_new_weights(
    engine, hf_model, new_model
):
    version = engine.weight_version
    engine.generate([PROMPT], {"max_tokens": 2})  # the prompt's blocks cached, old weights
    long = Background(
        lambda: engine.generate([PROMPT], {"max_tokens": 300, "ignore_eos": True, "seed": 8})
    )
    steps = engine.loop_stats()["steps"]
    wait_until("20 steps of the long request", lambda: engine.loop.counts()["steps"] > steps + 20)
    with engine.loop.hold():
        assert engine.loop.counts()["running_requests"] == 1
        swap = Background(
            lambda: engine.swap_weights(new_model.state_dict().items(), strategy="hotswap")
        )
        wait_until("the swap to be queued", lambda: engine.loop.counts()["tasks"] == 1)
    report = swap.result()
    later = engine.generate([PROMPT], {"max_tokens": 16, "seed": 9})[0]["completions"][0]
    mixed = long.result()[0]["completions"][0]

    assert report["strategy"] == "hotswap" and report["requests_in_flight"] == 1
    assert (mixed["weight_version_start"], mixed["weight_version_end"]) == (version, version + 1)
    [[v0, start, cut], [v1, cut_again, end]] = mixed["weight_version_spans"]
    assert (v0, start, v1, cut_again, end) == (version, 0, version + 1, cut, 300)
    assert 20 <= cut < 300
    tokens, got = mixed["token_ids"], mixed["logprobs"]
    old_diff = max_diff(reference_log_probs(hf_model, PROMPT, tokens)[:cut], got[:cut])
    new_diff = max_diff(reference_log_probs(new_model, PROMPT, tokens)[cut:], got[cut:])
    later_diff = max_diff(
        reference_log_probs(new_model, PROMPT, later["token_ids"]), later["logprobs"]
    )
    print(
        f"hotswap after {cut} tokens: before the swap vs old weights {old_diff:.1e}, after it "
        f"vs new weights {new_diff:.1e}; a later request vs new weights {later_diff:.1e}"
    )
    assert old_diff < TOLERANCE and new_diff < TOLERANCE and later_diff < TOLERANCE
    assert (later["weight_version_start"], later["weight_version_end"]) == (version + 1,) * 2
    assert "weight_version_spans" not in later


def test_close_fails_waiting_calls_clearly(tiny_model_path, vllm_test_config):
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    engine = VLLMSamplingEngine(vllm_test_config(tiny_model_path, kv_cache_memory_bytes=64 << 20))
    with engine.loop.hold():
        waiting = Background(lambda: engine.generate([[50, 51]], {"max_tokens": 4}))
        wait_until("the call to be queued", lambda: engine.loop.counts()["queued_calls"] == 1)
        engine.close()

    with pytest.raises(EngineError, match="closed while this call waited"):
        waiting.result()
    with pytest.raises(EngineError, match="closed"):
        engine.generate([[50, 51]], {"max_tokens": 4})


MULTIPROCESS_HOTSWAP = """
import threading, time
import torch, transformers
from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine


def log_probs(model, prompt, completion):
    ids = prompt + completion
    with torch.no_grad():
        table = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [float(table[len(prompt) + j - 1, t]) for j, t in enumerate(completion)]


def diff(a, b):
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def main(path):
    engine = VLLMSamplingEngine(engine_config(path, 128 << 20, sampling_gpus=1))
    old = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    new = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(1.1)
    prompt = [(7 * i) % 300 + 40 for i in range(140)]
    out = {}
    params = {"max_tokens": 400, "ignore_eos": True, "seed": 3}
    long = threading.Thread(target=lambda: out.update(long=engine.generate([prompt], params)))
    long.start()
    deadline = time.monotonic() + 120
    while engine.loop.counts()["steps"] < 20 and time.monotonic() < deadline:
        time.sleep(0.002)
    report = engine.swap_weights(new.state_dict().items(), strategy="hotswap")
    later = engine.generate([prompt], {"max_tokens": 16, "seed": 4})[0]["completions"][0]
    long.join(120)
    mixed = out["long"][0]["completions"][0]
    spans = mixed.get("weight_version_spans") or []
    cut = spans[0][2] if len(spans) == 2 else 0
    tokens, got = mixed["token_ids"], mixed["logprobs"]
    result = {
        "in_process": engine.in_process, "report": report, "spans": spans,
        "old_diff": diff(log_probs(old, prompt, tokens)[:cut], got[:cut]),
        "new_diff": diff(log_probs(new, prompt, tokens)[cut:], got[cut:]),
        "later_diff": diff(log_probs(new, prompt, later["token_ids"]), later["logprobs"]),
        "later_versions": [later["weight_version_start"], later["weight_version_end"]],
    }
    engine.close()
    return result
"""


def test_hotswap_in_a_multiprocess_engine_pauses_its_core_for_the_swap(tiny_model_path, tmp_path):
    result = run_engine_program(MULTIPROCESS_HOTSWAP, tiny_model_path, tmp_path)  # in_process False
    assert result["report"]["requests_in_flight"] == 1
    [[v0, start, cut], [v1, cut_again, end]] = result["spans"]
    assert (v1, start, cut_again, end) == (v0 + 1, 0, cut, 400) and 0 < cut < 400
    assert result["old_diff"] < TOLERANCE and result["new_diff"] < TOLERANCE
    assert result["later_diff"] < TOLERANCE
    assert result["later_versions"] == [v1, v1]


def test_each_weight_version_salts_the_prefix_cache_on_its_own(engine, hf_model):
    from arctic_rl_engines.vllm_sampling import prefix_cache_salt

    seen: list[Any] = []
    submit = engine.loop.submit

    def recording(prompts, *args, **kwargs):
        seen.append([p.get("cache_salt") for p in prompts])
        return submit(prompts, *args, **kwargs)

    engine.loop.submit = recording
    try:
        params = {"max_tokens": 3, "seed": 5}
        first = engine.generate([[50, 51, 52], [50, 51, 53]], params)
        version = engine.weight_version
        engine.swap_weights(hf_model.state_dict().items(), strategy="drain")  # same weights
        again = engine.generate([[50, 51, 52]], params)
    finally:
        del engine.loop.submit
    assert seen == [[prefix_cache_salt(version)] * 2, [prefix_cache_salt(version + 1)]]
    assert prefix_cache_salt(version) != prefix_cache_salt(version + 1)
    # the salt changes which cached blocks a request may reuse, never what it samples
    assert again[0]["completions"][0]["token_ids"] == first[0]["completions"][0]["token_ids"]
    assert again[0]["completions"][0]["weight_version_start"] == version + 1
