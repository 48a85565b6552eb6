"""A session's turns merged into training rows.

Rule. Within a segment every turn's prompt starts with the previous turn's prompt and
completion, so the segment's last turn holds the whole episode: one row is its prompt ids +
completion ids (the ``n`` choices of one request are sibling leaves: one row each). The loss
mask is 1 exactly at each turn's completion positions
(``len(prompt_ids)`` on) and 0 on prompts, bridges, tool results and any eos the session
added; ``rollout_log_probs`` holds each sampled id's log-prob at its position, 0.0 elsewhere. A
turn that (against the rule) does not extend the row before it starts a new row.
"""

from __future__ import annotations

from collections.abc import Sequence

from arctic_platform.rl.agents.models import SessionState, SessionTurn, Trajectory, TrajectoryRow


def _extends(row: list[int], turn: SessionTurn) -> bool:
    return len(turn.prompt_ids) >= len(row) and turn.prompt_ids[: len(row)] == row


def _ids(turn: SessionTurn) -> list[int]:
    return [*turn.prompt_ids, *turn.completion_ids]


def merge_rows(turns: Sequence[SessionTurn]) -> list[TrajectoryRow]:
    """One row per turn that no later turn of its segment extends (a leaf), holding every
    earlier turn of the segment whose ids it extends: a chain of turns is one row; the
    ``n`` choices of one request are sibling leaves, one row each, sharing their prefix."""
    groups: list[list[SessionTurn]] = []
    for i, turn in enumerate(turns):
        row = _ids(turn)
        later = turns[i + 1 :]
        if any(t.segment == turn.segment and _extends(row, t) for t in later):
            continue
        chain = [t for t in turns[:i] if t.segment == turn.segment and _extends(_ids(t), turn)]
        groups.append([*chain, turn])
    return [_row(group) for group in groups]


def _row(group: list[SessionTurn]) -> TrajectoryRow:
    last = group[-1]
    ids = [*last.prompt_ids, *last.completion_ids]
    mask = [0.0] * len(ids)
    log_probs = [0.0] * len(ids)
    for turn in group:
        start = len(turn.prompt_ids)
        for offset, value in enumerate(turn.completion_log_probs):
            mask[start + offset] = 1.0
            log_probs[start + offset] = float(value)
    return TrajectoryRow(
        segment=last.segment,
        turns=[t.index for t in group],
        input_ids=ids,
        loss_mask=mask,
        rollout_log_probs=log_probs,
    )


def build_trajectory(state: SessionState) -> Trajectory:
    """The session's turns and merged rows."""
    turns = list(state.turns)
    return Trajectory(session_id=state.session_id, turns=turns, rows=merge_rows(turns))
