"""verifiers 0.4.0's ``TrainClient`` (Prime's token-in/token-out training client) drives an
agent session of a real local http server for two turns, the second holding a tool result
(issue 26, item 8; AGENT-CLIENTS.md acceptance criterion 5).

verifiers pins ``openai<3``, so it runs from its own ``.venv-verifiers`` (built here on first
use by ``support.verifiers_venv``; a failed build fails the test, never skips it) as a
subprocess: ``verifiers_driver.py``. The client renders prompts itself with ``Qwen3Renderer``
from the tiny ChatML model's tokenizer dir, asks ``GET {base}/models`` for ``max_model_len``
and samples through ``POST /s/{sid}/inference/v1/generate`` with ``X-Session-ID``. One
episode calls ``get_response`` plainly (each turn re-rendered), one passes the trace graph's
``PendingTurn`` so turn 2 is bridged from turn 1's ids (one segment, no prefix break).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import verifiers_venv
from support.tools import lookup_tool

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("verifiers_driver.py")
DRIVER_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def verifiers_python() -> str:
    """The interpreter of ``.venv-verifiers``, built now if missing (a failure fails)."""
    try:
        return str(verifiers_venv.ensure())
    except verifiers_venv.VenvBuildError as exc:
        pytest.fail(f"building the verifiers venv failed:\n{exc}", pytrace=False)


@pytest.fixture
def rl(agents_rl: Any) -> Any:
    """The folder's shared server (``conftest.agents_rl``)."""
    return agents_rl


def _driver_env() -> dict[str, str]:
    """This process's environment, offline, without the project venv's paths, and with the
    loopback server reached directly (never through a proxy)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    loopback = "127.0.0.1,localhost"
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = f"{env[name]},{loopback}" if env.get(name) else loopback
    return env


def _drive(python: str, handle: Any, model_dir: str, *more: str) -> dict[str, Any]:
    """Run the driver against ``handle``'s session; its JSON report (stderr on failure)."""
    assert handle.base_url is not None
    command = [
        python,
        str(DRIVER),
        "--base-url",
        handle.base_url,
        "--api-key",
        handle.api_key,
        "--session-id",
        handle.session_id,
        "--model",
        handle.model,
        "--renderer-model",
        model_dir,
        "--tools",
        json.dumps([lookup_tool(strict=False)]),
        *more,
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        env=_driver_env(),
        check=False,
    )
    assert done.returncode == 0, f"the verifiers driver failed:\n{done.stderr[-8000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_episode(rl: Any, handle: Any, report: dict[str, Any]) -> list[dict[str, Any]]:
    """What both episodes must show: ``/models`` with ``max_model_len``; per generate answer
    ``token:"token_id:N"`` log-probs, one per id, finite and never -9999, ending on the
    renderer's stop ids or the budget; both turns recorded under the session. The recorded
    turns are returned."""
    (card,) = report["models"]["data"]
    assert card["id"] == handle.model
    assert isinstance(card["max_model_len"], int) and card["max_model_len"] > 0
    assert report["max_prompt_len"] == card["max_model_len"]  # the renderer read it too

    turns, raw = report["turns"], report["raw"]
    assert len(turns) == len(raw) == 2
    stop_ids = set(report["stop_token_ids"])
    for turn, answer in zip(turns, raw, strict=True):
        choice = answer["choices"][0]
        ids = choice["token_ids"]
        content = choice["logprobs"]["content"]
        assert ids and turn["completion_ids"] == ids
        assert [entry["token"] for entry in content] == [f"token_id:{i}" for i in ids]
        assert [entry["token_id"] for entry in content] == ids
        values = [entry["logprob"] for entry in content]
        assert all(math.isfinite(v) and v != -9999 for v in values), values
        assert turn["completion_logprobs"] == values
        assert answer["prompt_token_ids"] == turn["prompt_ids"]
        if choice["finish_reason"] == "stop":
            assert ids[-1] in stop_ids
        else:
            assert choice["finish_reason"] == "length"
            assert not stop_ids & set(ids)

    recorded = rl.session_trajectory(handle.session_id)["turns"]
    assert len(recorded) == 2
    for stored, turn in zip(recorded, turns, strict=True):
        assert stored["prompt_ids"] == turn["prompt_ids"]
        assert stored["completion_ids"] == turn["completion_ids"]
        assert stored["completion_log_probs"] == pytest.approx(turn["completion_logprobs"])
    assert len(turns[1]["prompt_ids"]) > len(turns[0]["prompt_ids"])
    listed = {s["session_id"]: s["turns"] for s in rl.list_sessions()}
    assert listed[handle.session_id] == 2
    return list(recorded)


def _extends(turns: list[dict[str, Any]]) -> bool:
    """Whether turn 2's prompt starts with turn 1's prompt + sampled ids."""
    history = turns[0]["prompt_ids"] + turns[0]["completion_ids"]
    return bool(turns[1]["prompt_ids"][: len(history)] == history)


def test_train_client_runs_two_turns_with_a_tool_result(rl, verifiers_python, chatml_model_path):
    """``get_response`` without a trace graph, as AGENT-CLIENTS.md's criterion 5 calls it:
    the client re-renders the whole history each turn (sampled text re-encoded), so the
    session keeps one segment only when that re-render extends turn 1's ids, and otherwise
    starts a new one marked ``prefix_break`` (never an error)."""
    handle = rl.open_session(ttl=600)
    assert handle.base_url is not None and handle.base_url.endswith(f"/s/{handle.session_id}/v1")
    report = _drive(verifiers_python, handle, chatml_model_path)
    assert report["bridged"] == [False, False]
    recorded = _check_episode(rl, handle, report)
    extends = _extends(report["turns"])
    assert recorded[1]["prefix_break"] is (not extends)
    assert recorded[1]["segment"] == (0 if extends else 1)
    rl.close_session(handle.session_id)


def test_bridged_turns_keep_the_sampled_ids(rl, verifiers_python, chatml_model_path):
    """With the ``PendingTurn`` of a verifiers trace graph (what its interception server
    passes), ``Qwen3Renderer.bridge_to_next_turn`` builds turn 2 from turn 1's exact ids: the
    session records one segment, no prefix break, and reuses all of turn 1."""
    handle = rl.open_session(ttl=600)
    report = _drive(verifiers_python, handle, chatml_model_path, "--bridge")
    assert report["bridged"] == [False, True]
    recorded = _check_episode(rl, handle, report)
    assert _extends(report["turns"])
    first = report["turns"][0]
    assert recorded[1]["prefix_break"] is False and recorded[1]["segment"] == 0
    assert recorded[1]["reused"] == len(first["prompt_ids"]) + len(first["completion_ids"])
    rl.close_session(handle.session_id)


if __name__ == "__main__":  # pragma: no cover - a manual run of this file
    sys.exit(pytest.main([__file__, "-v"]))
