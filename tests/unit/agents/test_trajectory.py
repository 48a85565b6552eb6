"""Trajectories: one merged row per segment whose loss mask is 1 exactly on sampled ids and 0
on prompts, bridges and tool results, log-probs aligned one per id, in ``Batch`` shape; and
the in-memory ``SessionStore``."""

from __future__ import annotations

from typing import Any

import pytest

from arctic_platform.rl.agents import AgentSession, SessionState, SessionStore, Trajectory
from arctic_platform.rl.errors import NotFoundError

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>'
USER = [{"role": "user", "content": "value of key 4821?"}]


def _log_probs(ids: list[int], base: float) -> list[float]:
    return [base - 0.01 * i for i in range(len(ids))]


def _episode(chat_tok: Any, tools: Any, *, length_stop: bool = False) -> AgentSession:
    """Tool call, tool result, final answer (then, optionally, a third turn)."""
    session = AgentSession(SessionState(session_id="t", model="tiny"), chat_tok)
    ids1 = [*chat_tok.encode(CALL), chat_tok.eos_id]
    plan1 = session.prompt(USER, tools)
    _, parsed = session.record(plan1, USER, tools, ids1, _log_probs(ids1, -0.1))
    calls = [c.model_dump() for c in parsed.message.tool_calls]
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "1234"},
    ]
    ids2 = chat_tok.encode("The value is 1234")
    if not length_stop:
        ids2 = [*ids2, chat_tok.eos_id]
    plan2 = session.prompt(messages, tools)
    finish = "length" if length_stop else "stop"
    _, parsed2 = session.record(
        plan2,
        messages,
        tools,
        ids2,
        _log_probs(ids2, -0.5),
        finish_reason=finish,
        weight_version_start=0,
        weight_version_end=1,
        weight_version_spans=[[0, 0, 2], [1, 2, len(ids2)]],
    )
    if length_stop:
        messages = [*messages, parsed2.message.to_openai(), {"role": "user", "content": "ok"}]
        ids3 = [*chat_tok.encode("yes"), chat_tok.eos_id]
        plan3 = session.prompt(messages, tools)
        session.record(plan3, messages, tools, ids3, _log_probs(ids3, -0.9))
    return session


def _sampled_positions(trajectory: Trajectory) -> set[int]:
    out: set[int] = set()
    for turn in trajectory.turns:
        start = len(turn.prompt_ids)
        out.update(range(start, start + len(turn.completion_ids)))
    return out


@pytest.mark.parametrize("length_stop", [False, True])
def test_one_row_masks_exactly_the_sampled_ids(
    chat_tok: Any, tools: Any, length_stop: bool
) -> None:
    trajectory = _episode(chat_tok, tools, length_stop=length_stop).trajectory()
    assert len(trajectory.rows) == 1
    [row] = trajectory.rows
    last = trajectory.turns[-1]
    assert row.input_ids == last.prompt_ids + last.completion_ids
    assert row.turns == [t.index for t in trajectory.turns]
    assert len(row.loss_mask) == len(row.rollout_log_probs) == len(row.input_ids)
    sampled = _sampled_positions(trajectory)
    assert {i for i, m in enumerate(row.loss_mask) if m == 1.0} == sampled
    assert all(m == 0.0 for i, m in enumerate(row.loss_mask) if i not in sampled)
    for turn in trajectory.turns:  # every turn's ids and log-probs at their positions
        start = len(turn.prompt_ids)
        span = slice(start, start + len(turn.completion_ids))
        assert row.input_ids[span] == turn.completion_ids
        assert row.rollout_log_probs[span] == turn.completion_log_probs
    assert all(lp == 0.0 for i, lp in enumerate(row.rollout_log_probs) if i not in sampled)
    # tool-result and bridge tokens are never trained
    second = trajectory.turns[1]
    bridge = range(second.reused, len(second.prompt_ids))
    assert bridge and all(row.loss_mask[i] == 0.0 for i in bridge)
    assert chat_tok.token_id("<tool_response>") in [row.input_ids[i] for i in bridge]
    if length_stop:  # the eos the session added after the cut completion is not sampled
        third = trajectory.turns[2]
        assert third.appended_eos
        assert row.input_ids[third.reused] == chat_tok.eos_id
        assert row.loss_mask[third.reused] == 0.0


def test_turn_records_keep_versions_and_calls(chat_tok: Any, tools: Any) -> None:
    trajectory = _episode(chat_tok, tools).trajectory()
    first, second = trajectory.turns
    assert first.message.tool_calls[0].id == "call_t_0_0"
    assert first.finish_reason == "tool_calls"
    assert (second.weight_version_start, second.weight_version_end) == (0, 1)
    assert second.weight_version_spans == [[0, 0, 2], [1, 2, len(second.completion_ids)]]
    assert not second.prefix_break
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again == trajectory


def test_a_prefix_break_gives_a_second_row(chat_tok: Any, tools: Any) -> None:
    session = _episode(chat_tok, tools)
    edited = [{"role": "user", "content": "value of key 9?"}]
    plan = session.prompt(edited, tools)
    ids = [*chat_tok.encode("no"), chat_tok.eos_id]
    session.record(plan, edited, tools, ids, _log_probs(ids, -0.2))
    trajectory = session.trajectory()
    assert [r.segment for r in trajectory.rows] == [0, 1]
    assert [r.turns for r in trajectory.rows] == [[0, 1], [2]]
    assert trajectory.rows[1].input_ids == plan.prompt_ids + ids
    assert sum(trajectory.rows[1].loss_mask) == len(ids)


def test_rows_in_batch_shape(chat_tok: Any, tools: Any) -> None:
    trajectory = _episode(chat_tok, tools).trajectory()
    fields = trajectory.batch_fields()
    assert set(fields) == {"input_ids", "loss_mask", "rollout_log_probs"}
    batch = trajectory.to_batch(advantages=[0.5])
    assert batch.num_rows == 1
    [row] = trajectory.rows
    assert batch.row("input_ids", 0).tolist() == row.input_ids
    assert batch.row("loss_mask", 0).tolist() == row.loss_mask
    assert batch.row("rollout_log_probs", 0).tolist() == pytest.approx(row.rollout_log_probs)


def test_store_open_get_list_close_expire(chat_tok: Any) -> None:
    now = [100.0]
    store = SessionStore(lambda model: chat_tok, default_ttl=10.0, clock=lambda: now[0])
    a = store.open("tiny", max_staleness=0)
    b = store.open("tiny", ttl=50.0)
    assert a.session_id != b.session_id and a.key != b.key
    assert store.get(a.session_id, a.key).state.max_staleness == 0
    with pytest.raises(NotFoundError):
        store.get(a.session_id, b.key)
    with pytest.raises(NotFoundError):
        store.get("nope")
    assert {s.session_id for s in store.list()} == {a.session_id, b.session_id}
    assert store.expire(now=110.0) == [a.session_id]
    with pytest.raises(NotFoundError):
        store.get(a.session_id)
    now[0] = 140.0
    store.touch(b.session_id)
    assert store.expire(now=155.0) == []
    assert store.close(b.session_id).session_id == b.session_id
    assert store.list() == []
    with pytest.raises(NotFoundError):
        store.close(b.session_id)


def test_importing_agents_loads_no_heavy_library() -> None:
    import subprocess
    import sys

    program = (
        "import sys, arctic_platform.rl.agents\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)
