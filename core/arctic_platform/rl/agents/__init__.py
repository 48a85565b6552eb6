"""Agent sessions, the pure core: token-faithful multi-turn prompts (``turns``), tool calls
parsed from sampled ids (``tool_calls``), trajectories merged into training rows
(``trajectory``), their pydantic models (``models``) and an in-memory ``SessionStore``.

Nothing here talks to a server or an engine; ``transformers`` is imported only when a
``ChatTokenizer`` is loaded.
"""

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.history import history_mismatch, same_message
from arctic_platform.rl.agents.models import (
    AssistantMessage,
    SessionState,
    SessionTurn,
    ToolCall,
    ToolCallFunction,
    Trajectory,
    TrajectoryRow,
)
from arctic_platform.rl.agents.session import AgentSession
from arctic_platform.rl.agents.store import OpenedSession, SessionStore
from arctic_platform.rl.agents.tool_calls import ParsedCompletion, call_id, parse_completion
from arctic_platform.rl.agents.trajectory import build_trajectory, merge_rows
from arctic_platform.rl.agents.turns import PromptPlan, bridge_text, plan_prompt

__all__ = [
    "AgentSession",
    "AssistantMessage",
    "ChatTokenizer",
    "OpenedSession",
    "ParsedCompletion",
    "PromptPlan",
    "SessionState",
    "SessionStore",
    "SessionTurn",
    "ToolCall",
    "ToolCallFunction",
    "Trajectory",
    "TrajectoryRow",
    "bridge_text",
    "build_trajectory",
    "call_id",
    "history_mismatch",
    "merge_rows",
    "parse_completion",
    "plan_prompt",
    "same_message",
]
