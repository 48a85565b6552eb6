"""``AgentSession``: one session's state and tokenizer, turning requests into prompt ids and
sampled ids into recorded turns (no engine, no server)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.history import as_dict
from arctic_platform.rl.agents.models import (
    RequestRecord,
    SampledChoice,
    SessionState,
    SessionTurn,
    Trajectory,
)
from arctic_platform.rl.agents.tool_calls import ParsedCompletion, parse_completion
from arctic_platform.rl.agents.trajectory import build_trajectory
from arctic_platform.rl.agents.turns import PromptPlan, plan_ids, plan_prompt


class AgentSession:
    """A session: ``prompt`` plans the next turn's prompt ids from a request's messages,
    ``record`` parses what was sampled for it and stores the turn. Calls are serialised."""

    def __init__(self, state: SessionState, tokenizer: ChatTokenizer) -> None:
        self.state = state
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def prompt(
        self, messages: Sequence[Any], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> PromptPlan:
        """The prompt ids (and segment) of the next turn for this request; a new segment's
        number is taken now, so requests planned together never share one by accident."""
        with self._lock:
            return self._take(plan_prompt(self.tokenizer, self.state, messages, tools))

    def prompt_ids(self, prompt_ids: Sequence[int]) -> PromptPlan:
        """The plan of a request whose prompt the client gave as token ids."""
        with self._lock:
            return self._take(plan_ids(self.state, prompt_ids))

    def _take(self, plan: PromptPlan) -> PromptPlan:
        if plan.parent is None:
            self.state.next_segment = max(self.state.next_segment, plan.segment + 1)
        return plan

    def record(
        self,
        plan: PromptPlan,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None,
        completion_ids: Sequence[int],
        log_probs: Sequence[float],
        *,
        finish_reason: str = "stop",
        weight_version_start: int | None = None,
        weight_version_end: int | None = None,
        weight_version_spans: Sequence[Sequence[int]] | None = None,
    ) -> tuple[SessionTurn, ParsedCompletion]:
        """Parse ``completion_ids`` (tool calls from the ids) and record the turn sampled for
        ``plan``; this request's messages and tools become the history the next one must
        re-send. Returns the turn and the parsed completion (the message to answer with)."""
        sampled = SampledChoice(
            completion_ids=list(completion_ids),
            log_probs=[float(v) for v in log_probs],
            finish_reason=finish_reason,
            weight_version_start=weight_version_start,
            weight_version_end=weight_version_end,
            weight_version_spans=[list(x) for x in weight_version_spans]
            if weight_version_spans
            else None,
        )
        return self.record_choices(plan, messages, tools, [sampled])[0]

    def record_choices(
        self,
        plan: PromptPlan,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None,
        choices: Sequence[SampledChoice],
    ) -> list[tuple[SessionTurn, ParsedCompletion]]:
        """Record the ``n`` choices sampled for one ``plan`` as sibling turns (same prompt,
        same segment); a later request may continue any of them. ``messages`` empty and
        ``tools`` None with a plan from ``prompt_ids``: a token-in request."""
        with self._lock:
            out = []
            for choice in choices:
                index = len(self.state.turns)
                parsed = parse_completion(
                    choice.completion_ids,
                    self.tokenizer,
                    session_id=self.state.session_id,
                    turn=index,
                    finish_reason=choice.finish_reason,
                )
                turn = SessionTurn(
                    index=index,
                    segment=plan.segment,
                    parent=plan.parent,
                    prefix_break=plan.prefix_break,
                    prompt_ids=list(plan.prompt_ids),
                    completion_ids=list(choice.completion_ids),
                    completion_log_probs=list(choice.log_probs),
                    message=parsed.message,
                    finish_reason=parsed.finish_reason,
                    weight_version_start=choice.weight_version_start,
                    weight_version_end=choice.weight_version_end,
                    weight_version_spans=choice.weight_version_spans,
                    reused=plan.reused,
                    appended_eos=plan.appended_eos,
                )
                self.state.turns.append(turn)
                out.append((turn, parsed))
            sent = [as_dict(m) for m in messages]
            added = sent if plan.parent is None else sent[plan.continued + 1 :]
            self.state.requests.append(
                RequestRecord(
                    turns=[turn.index for turn, _ in out],
                    parent=plan.parent,
                    messages=added,
                    tools=[dict(t) for t in tools] if tools else None,
                    chat=bool(messages),
                )
            )
            return out

    def trajectory(self) -> Trajectory:
        """The session's turns and merged rows."""
        with self._lock:
            return build_trajectory(self.state.model_copy(deep=True))
