"""Which earlier turn of a session a new request continues, whatever came in between.

A session may carry several conversations at once (an agent harness running episodes in
parallel on one key, or ``n`` choices each continued). A request continues a turn when:

- chat: its messages start with the history of the request that recorded the turn, then the
  turn's answer (compared by meaning, ``history``), and its tools are that request's;
- token ids: its prompt starts with the turn's prompt and completion ids.

Every earlier turn is a candidate, not only the last request's, so the segment a request
joins follows its conversation, not the timing of other requests; the longest match wins
(the newest of equals).
A request's history is rebuilt from its ``RequestRecord`` chain (each record keeps only the
messages it added), so a session's memory grows with its turns, not their square.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arctic_platform.rl.agents.history import history_mismatch, same_message, same_tools
from arctic_platform.rl.agents.models import SessionState, SessionTurn


def request_of_turns(state: SessionState) -> dict[int, int]:
    """Each turn's index -> the index of the request that recorded it."""
    return {t: r for r, record in enumerate(state.requests) for t in record.turns}


def request_history(state: SessionState, request: int, owner: Mapping[int, int]) -> list[Any]:
    """The messages request ``request`` sent: its chain's added messages, each earlier
    request's continued answer between them (``owner``: ``request_of_turns``)."""
    parts: list[list[Any]] = []
    record = state.requests[request]
    while True:
        parts.append(list(record.messages))
        if record.parent is None:
            break
        parts.append([state.turns[record.parent].message.to_openai()])
        record = state.requests[owner[record.parent]]
    return [message for part in reversed(parts) for message in part]


def chat_parent(
    state: SessionState,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
) -> tuple[SessionTurn | None, int, str | None]:
    """The turn ``messages`` continue, how many of them its history holds, and (None found)
    why no turn is continued; the longest history wins (the newest of equals)."""
    owner = request_of_turns(state)
    lengths: dict[int, int] = {}

    def length(request: int) -> int:  # messages the request sent, without rebuilding them
        chain = []  # the request and its ancestors not counted yet (no recursion: long chains)
        at: int | None = request
        while at is not None and at not in lengths:
            chain.append(at)
            parent = state.requests[at].parent
            at = None if parent is None else owner[parent]
        base = 0 if at is None else lengths[at]
        for r in reversed(chain):
            record = state.requests[r]
            base = (0 if record.parent is None else base + 1) + len(record.messages)
            lengths[r] = base
        return lengths[request]

    best: tuple[SessionTurn | None, int] = (None, -1)
    tools_seen = False
    for request in range(len(state.requests) - 1, -1, -1):
        record = state.requests[request]
        if not record.chat or not same_tools(record.tools, tools):
            continue
        tools_seen = True
        sent = length(request)
        if len(messages) < sent + 1 or sent <= best[1]:
            continue
        for index in record.turns:
            turn = state.turns[index]
            answer = turn.message.to_openai()
            if not same_message(answer, messages[sent], trim_content=True):
                continue
            history = request_history(state, request, owner)
            if history_mismatch(history, answer, messages) is None:
                best = (turn, sent)
                break
    if best[0] is not None:
        return best[0], best[1], None
    if not tools_seen and any(record.chat for record in state.requests):
        return None, 0, "the tools differ from every earlier request's"
    return None, 0, "no earlier request's history and answer start these messages"


def ids_parent(state: SessionState, prompt: Sequence[int]) -> SessionTurn | None:
    """The turn with the longest prompt and completion ids that start ``prompt`` (the newest
    of equals; None: none does)."""
    prompt = list(prompt)
    best: SessionTurn | None = None
    best_size = -1
    for turn in reversed(state.turns):
        size = len(turn.prompt_ids) + len(turn.completion_ids)
        if size > len(prompt) or size <= best_size:
            continue
        if prompt[: len(turn.prompt_ids)] != turn.prompt_ids:
            continue
        if prompt[len(turn.prompt_ids) : size] == turn.completion_ids:
            best, best_size = turn, size
    return best


__all__ = ["chat_parent", "ids_parent", "request_history", "request_of_turns"]
