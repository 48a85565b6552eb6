"""The pydantic models of agent sessions that cross a boundary: tool calls, assistant
messages, recorded turns, trajectories and a session's state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from arctic_platform.rl.batch import Batch


class ToolCallFunction(BaseModel):
    """The function part of an OpenAI tool call: a name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One OpenAI-style tool call the session parsed from sampled ids."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    """The assistant message a turn answered: text content and/or tool calls."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat message dict (``tool_calls`` only when there are)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return out


class SampledChoice(BaseModel):
    """One completion the engine sampled for a turn's prompt: its ids and their log-probs, why
    it stopped and the weight versions it saw (before it is parsed and recorded)."""

    completion_ids: list[int]
    log_probs: list[float]
    finish_reason: str = "stop"
    weight_version_start: int | None = None
    weight_version_end: int | None = None
    weight_version_spans: list[list[int]] | None = None

    @classmethod
    def from_engine(cls, completion: dict[str, Any]) -> SampledChoice:
        """A sampling engine's completion record (``token_ids``, ``logprobs``, ...)."""
        return cls(
            completion_ids=[int(i) for i in completion["token_ids"]],
            log_probs=[float(v) for v in completion["logprobs"]],
            finish_reason=str(completion.get("finish_reason") or "stop"),
            weight_version_start=completion.get("weight_version_start"),
            weight_version_end=completion.get("weight_version_end"),
            weight_version_spans=completion.get("weight_version_spans"),
        )


class SessionTurn(BaseModel):
    """One sampled turn: its exact prompt ids, the sampled ids and their log-probs, the
    message it answered, the weight versions it saw and the segment it belongs to.

    ``reused`` is how many leading prompt ids were taken verbatim from the previous turn's
    prompt and completion (0 for a segment's first turn); ``appended_eos`` says the previous
    completion did not end with eos and one eos id was added after it (see ``turns``).
    """

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    segment: int = Field(ge=0)
    parent: int | None = Field(default=None, ge=0)
    """The turn whose prompt and completion this turn's prompt continues (None: it began
    its segment)."""
    prefix_break: bool = False
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_log_probs: list[float]
    message: AssistantMessage
    finish_reason: str
    weight_version_start: int | None = None
    weight_version_end: int | None = None
    weight_version_spans: list[list[int]] | None = None
    reused: int = Field(default=0, ge=0)
    appended_eos: bool = False

    @model_validator(mode="after")
    def _one_log_prob_per_id(self) -> SessionTurn:
        if len(self.completion_log_probs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_log_probs)} log-probs for "
                f"{len(self.completion_ids)} completion ids"
            )
        if self.reused > len(self.prompt_ids):
            raise ValueError("reused is longer than the prompt")
        return self


class TrajectoryRow(BaseModel):
    """One training row: a segment's last prompt plus completion, with a loss mask that is 1
    exactly on sampled ids and the sampled ids' log-probs at their positions (0.0 elsewhere)."""

    segment: int
    turns: list[int]
    input_ids: list[int]
    loss_mask: list[float]
    rollout_log_probs: list[float]

    @model_validator(mode="after")
    def _aligned(self) -> TrajectoryRow:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise ValueError("loss_mask and rollout_log_probs must have one value per input id")
        return self


class Trajectory(BaseModel):
    """A session's turns and its merged rows (one per segment), ready to train on."""

    session_id: str
    turns: list[SessionTurn]
    rows: list[TrajectoryRow]

    def batch_fields(self) -> dict[str, list[list[Any]]]:
        """The rows as ``Batch`` fields: ``input_ids``, ``loss_mask``, ``rollout_log_probs``."""
        return {
            "input_ids": [r.input_ids for r in self.rows],
            "loss_mask": [r.loss_mask for r in self.rows],
            "rollout_log_probs": [r.rollout_log_probs for r in self.rows],
        }

    def to_batch(self, advantages: list[float] | None = None) -> Batch:
        """The rows as a checked ``Batch`` (``advantages``: one per row, optional)."""
        from arctic_platform.rl.batch import Batch

        fields: dict[str, Any] = dict(self.batch_fields())
        if advantages is not None:
            fields["advantages"] = advantages
        return Batch.build(fields)


class RequestRecord(BaseModel):
    """One request a session recorded: the turns of its ``n`` choices, the turn it continued
    (None: it began a segment), the messages it sent after that turn's history and answer
    (all of them when it began a segment) and its tools. A later request continues one of
    its choices when it re-sends that history, these messages and the choice's answer.
    ``chat`` is False for token-in requests, whose messages are not known."""

    turns: list[int]
    parent: int | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    chat: bool = True


class SessionState(BaseModel):
    """What a session remembers: its turns, the requests that recorded them (for finding
    which turn a later request continues) and the next free segment number."""

    session_id: str
    model: str
    max_staleness: int | None = None
    created_at: float = 0.0
    ttl: float | None = None
    expires_at: float | None = None
    turns: list[SessionTurn] = Field(default_factory=list)
    requests: list[RequestRecord] = Field(default_factory=list)
    next_segment: int = Field(default=0, ge=0)
