"""Every wait of the vLLM request loop has a timeout; a timed-out generate is aborted in vLLM.

Runs on the shared session sampling engine; ordering comes from ``loop.hold()`` (the loop
neither steps nor admits nor runs tasks while held), never from sleeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

pytest.importorskip("vllm")

from arctic_platform.rl.errors import EngineError
from arctic_rl_engines.vllm_loop import DEFAULT_TIMEOUT, op_timeout

pytestmark = pytest.mark.slow

WAIT = 120.0  # seconds any wait in these tests may take before it is a failure


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def test_the_loop_timeout_comes_from_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCTIC_RL_OP_TIMEOUT", "12.5")
    assert op_timeout() == 12.5
    monkeypatch.setenv("ARCTIC_RL_OP_TIMEOUT", "soon")
    assert op_timeout() == DEFAULT_TIMEOUT
    monkeypatch.delenv("ARCTIC_RL_OP_TIMEOUT")
    assert op_timeout() == DEFAULT_TIMEOUT


def test_a_timed_out_generate_is_aborted_in_vllm(vllm_sampling_engine) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = vllm_sampling_engine
    loop, core = engine.loop, engine.llm.llm_engine
    long = SamplingParams(max_tokens=900, ignore_eos=True)
    call = loop.submit([TokensPrompt(prompt_token_ids=[50, 51])], [long])
    wait_until(
        "the request to run",
        lambda: loop.counts()["steps"] > 0 and core.get_num_unfinished_requests() == 1,
    )
    with loop.hold():  # no step can finish it now
        with pytest.raises(EngineError, match=r"did not finish within 0\.05"):
            loop.wait(call, timeout=0.05)
    wait_until("vLLM to drop the request", lambda: core.get_num_unfinished_requests() == 0)
    assert loop.counts()["running_requests"] == 0
    assert engine.generate([[50, 51]], {"max_tokens": 3})[0]["completions"]


def test_generate_waits_at_most_the_loop_timeout(vllm_sampling_engine) -> None:
    engine = vllm_sampling_engine
    loop = engine.loop
    saved = loop.timeout
    outcome: dict[str, BaseException] = {}

    def call() -> None:
        try:
            engine.generate([[50, 51]], {"max_tokens": 3})
        except BaseException as exc:
            outcome["error"] = exc

    try:
        loop.timeout = 0.05
        with loop.hold():  # queued, never admitted: only the timeout can end the wait
            thread = threading.Thread(target=call, daemon=True)
            thread.start()
            thread.join(WAIT)
    finally:
        loop.timeout = saved
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), EngineError), outcome
    assert "did not finish within 0.05" in str(outcome["error"])
    assert loop.counts()["queued_calls"] == 0
    assert engine.generate([[50, 51]], {"max_tokens": 3})[0]["completions"]


def test_a_task_that_cannot_start_in_time_is_dropped(vllm_sampling_engine) -> None:
    loop = vllm_sampling_engine.loop
    ran = threading.Event()
    with loop.hold():
        with pytest.raises(EngineError, match="dropped"):
            loop.run(ran.set, "now", timeout=0.05)
    assert loop.run(lambda: 7, "now") == 7  # later tasks run; the dropped one never does
    assert not ran.is_set()
