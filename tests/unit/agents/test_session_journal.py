"""Agent sessions kept on disk (``SessionJournal``) and brought back by a resumed server's
``AgentOps.load_previous``: the same turns, key, history and trajectory, so the next turn is
still token-faithful; without ``--resume`` they are forgotten. No engine: a fake ``generate``
samples fixed ids."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from arctic_platform.rl import wire
from arctic_platform.rl.agents.journal import SessionJournal
from arctic_platform.rl.server.agent_ops import AgentOps
from arctic_platform.rl.server.job_state import Job, JobState

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call>'


class Jobs:
    """One sampling job (id 1) of the tokenizer's directory."""

    def __init__(self, model: str) -> None:
        self.job = Job(job_id=1, job_type="sampling", engine="vllm", config={}, num_gpus=1)
        self.job.config = {"model_name": model, "vllm_config": {"max_model_len": 1024}}
        self.job.state = JobState.RUNNING

    def get(self, job_id: int) -> Job:
        from arctic_platform.rl.errors import JobNotFoundError

        if job_id != 1:
            raise JobNotFoundError(f"no job {job_id}")
        return self.job


class Sampler:
    """``generate`` answering each request with the next of ``replies``."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = replies

    def __call__(self, request: wire.GenerateRequest) -> dict[str, Any]:
        ids = self.replies.pop(0)
        done = {
            "token_ids": ids,
            "logprobs": [-0.25] * len(ids),
            "finish_reason": "stop",
            "weight_version_start": 3,
            "weight_version_end": 3,
        }
        return {"outputs": [{"completions": [done]}], "weight_version": 3}


@pytest.fixture
def tok_dir(chat_tok: Any, tmp_path: Path) -> str:
    chat_tok.raw.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


def _ops(tok_dir: str, run_dir: Path, replies: list[list[int]], jobs: Jobs | None = None) -> Any:
    return AgentOps(jobs or Jobs(tok_dir), Sampler(replies), SessionJournal(run_dir / "sessions"))


def _two_turns(ops: Any, chat_tok: Any, tools: list[dict[str, Any]]) -> tuple[dict, list]:
    opened = ops.open_session(wire.OpenSessionRequest(job_id=1, ttl=600))
    sid = opened["session_id"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "value of key 4821?"}]
    first = ops.chat_completion(sid, {"model": "m", "messages": messages, "tools": tools})
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "1234"},
    ]
    ops.chat_completion(sid, {"model": "m", "messages": messages, "tools": tools})
    return opened, messages


def _journaled(chat_tok: Any, tok_dir: str, tools: list[dict[str, Any]], run_dir: Path) -> tuple:
    """A server's two-turn session (a call, then eos) on disk: its open answer and its file."""
    eos = chat_tok.eos_id
    ops = _ops(tok_dir, run_dir, [[*chat_tok.encode(CALL), eos], [eos]])
    opened, _ = _two_turns(ops, chat_tok, tools)
    return opened, run_dir / "sessions" / f"{opened['session_id']}.jsonl"


def test_a_resumed_server_brings_sessions_back_and_the_next_turn_stays_faithful(
    chat_tok, tok_dir, tools, tmp_path
):
    eos = chat_tok.eos_id
    replies = [[*chat_tok.encode(CALL), eos], [*chat_tok.encode("it is 1234"), eos]]
    before = _ops(tok_dir, tmp_path, replies)
    opened, messages = _two_turns(before, chat_tok, tools)
    sid = opened["session_id"]
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the session key
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = before.session_trajectory(wire.SessionRequest(session_id=sid))

    after = _ops(tok_dir, tmp_path, [[*chat_tok.encode("done"), eos]])
    assert after.load_previous(resume=True) == 1
    assert after.session_trajectory(wire.SessionRequest(session_id=sid)) == saved
    assert after.session_for_key(opened["key"]) == sid
    (listed,) = after.list_sessions(wire.ListSessionsRequest(job_id=1))["sessions"]
    assert listed["session_id"] == sid and listed["turns"] == 2
    # the history the client re-sends still matches: turn 3 extends turn 2 without a break
    messages += [{"role": "assistant", "content": "it is 1234"}, {"role": "user", "content": "ok"}]
    after.chat_completion(sid, {"model": "m", "messages": messages, "tools": tools})
    turns = after.session_trajectory(wire.SessionRequest(session_id=sid))["turns"]
    assert len(turns) == 3 and turns[2]["prefix_break"] is False
    assert turns[2]["prompt_ids"][: len(turns[1]["prompt_ids"])] == turns[1]["prompt_ids"]
    # and that turn reached the disk too
    again = _ops(tok_dir, tmp_path, [])
    assert again.load_previous(resume=True) == 1
    assert len(again.session_trajectory(wire.SessionRequest(session_id=sid))["turns"]) == 3


def test_without_resume_sessions_are_forgotten_and_closing_deletes_the_file(
    chat_tok, tok_dir, tools, tmp_path
):
    eos = chat_tok.eos_id
    ops = _ops(tok_dir, tmp_path, [[*chat_tok.encode(CALL), eos], [eos], [eos], [eos]])
    kept, _ = _two_turns(ops, chat_tok, tools)
    closed = ops.open_session(wire.OpenSessionRequest(job_id=1))
    ops.close_session(wire.SessionRequest(session_id=closed["session_id"]))
    files = sorted(p.name for p in (tmp_path / "sessions").iterdir())
    assert files == [f"{kept['session_id']}.jsonl"]
    fresh = _ops(tok_dir, tmp_path, [])
    assert fresh.load_previous(resume=False) == 0
    assert list((tmp_path / "sessions").iterdir()) == []
    assert fresh.list_sessions(wire.ListSessionsRequest())["sessions"] == []


def test_a_torn_last_line_keeps_the_turns_before_it(chat_tok, tok_dir, tools, tmp_path):
    eos = chat_tok.eos_id
    opened, path = _journaled(chat_tok, tok_dir, tools, tmp_path)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and "open" in json.loads(lines[0])
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # a crash
    back = _ops(tok_dir, tmp_path, [])
    assert back.load_previous(resume=True) == 1
    trajectory = back.session_trajectory(wire.SessionRequest(session_id=opened["session_id"]))
    (turn,) = trajectory["turns"]
    assert turn["completion_ids"] == [*chat_tok.encode(CALL), eos]


def test_sessions_of_an_ended_job_or_an_unreadable_file_do_not_come_back(
    chat_tok, tok_dir, tools, tmp_path
):
    _journaled(chat_tok, tok_dir, tools, tmp_path)
    (tmp_path / "sessions" / "0badf11e.jsonl").write_text("not json\n")
    jobs = Jobs(tok_dir)
    jobs.job.state = JobState.TERMINATED
    back = _ops(tok_dir, tmp_path, [], jobs)
    assert back.load_previous(resume=True) == 0
    assert back.list_sessions(wire.ListSessionsRequest())["sessions"] == []
    # the ended job's session file is gone; the unreadable one is left for a post-mortem
    assert [p.name for p in (tmp_path / "sessions").iterdir()] == ["0badf11e.jsonl"]


def test_expiry_starts_again_when_a_session_comes_back(chat_tok, tok_dir, tools, tmp_path):
    _, path = _journaled(chat_tok, tok_dir, tools, tmp_path)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["open"]["expires_at"] = 1.0  # long past: the server was down meanwhile
    path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    back = _ops(tok_dir, tmp_path, [])
    assert back.load_previous(resume=True) == 1
    (listed,) = back.list_sessions(wire.ListSessionsRequest())["sessions"]
    assert listed["expires_at"] > head["open"]["created_at"] + 599
