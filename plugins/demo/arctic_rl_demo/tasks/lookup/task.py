"""The agent demo's task: call ``lookup(key)`` and answer with exactly the value it returns.

The user asks ``lookup 4821``; the tool returns a value for that key only (four digits, drawn
per episode, so it can only be known by calling the tool with the right key); the reward is 1.0
when the agent's final answer, stripped of surrounding spaces, is exactly that value. A fixed
held-out set of keys (each with a fixed value, drawn from its own seed) is never used for
demonstrations or rollouts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from arctic_rl_demo.heldout import HeldOutDigits

TOOL_NAME = "lookup"
TOOL_DESCRIPTION = "Look up the value stored under a key."
INSTRUCTIONS = "Call lookup with the key, then answer with the value it returns."


@dataclass(frozen=True)
class Episode:
    """One task instance: the key the user asks about and the value the tool returns."""

    key: str
    value: str

    @property
    def prompt(self) -> str:
        """The user's message."""
        return f"lookup {self.key}"


@dataclass(frozen=True)
class LookupTask(HeldOutDigits):
    """Keys and values of ``digits`` digits; ``heldout_size`` fixed held-out episodes."""

    heldout_size: int = 64
    heldout_seed: int = 54321

    def heldout_pair(self, rng: random.Random) -> tuple[str, str]:
        """A held-out key and its value, each drawn."""
        return self.draw(rng), self.draw(rng)

    @cached_property
    def heldout(self) -> list[Episode]:
        """The fixed held-out episodes: distinct keys, fixed values, a stable order."""
        return [Episode(k, v) for k, v in self.heldout_answers.items()]

    def episodes(self, count: int, rng: random.Random) -> list[Episode]:
        """``count`` training episodes; never a held-out key."""
        return self.training(count, rng, lambda key: Episode(key, self.draw(rng)))

    @staticmethod
    def reward(final_output: Any, value: str) -> float:
        """1.0 when the final answer, stripped of surrounding spaces, is exactly ``value``."""
        return 1.0 if isinstance(final_output, str) and final_output.strip() == value else 0.0


def tool_schema() -> dict[str, Any]:
    """The ``lookup`` tool as openai-agents 0.24 sends it for a ``key: str`` function tool
    (strict schema), so demonstrations render the same system turn as the real requests."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "properties": {"key": {"title": "Key", "type": "string"}},
                "required": ["key"],
                "title": f"{TOOL_NAME}_args",
                "type": "object",
                "additionalProperties": False,
            },
            "strict": True,
        },
    }


def wordy_answer(episode: Episode) -> str:
    """The demonstrator's habitual mistake: the right value followed by a remark, which the
    exact reward refuses (the value's copy is the exact answer's, at the same place)."""
    return f"{episode.value} is the value."


def demonstration_messages(episode: Episode, answer: str | None = None) -> list[dict[str, Any]]:
    """The conversation a demonstration trains on: system, user, the call, its result, the
    answer (the assistant turns are what the loss covers); ``answer`` replaces the tool's
    value in the last turn (a demonstrator's mistake)."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": json.dumps({"key": episode.key})},
    }
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": episode.prompt},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": episode.value},
        {"role": "assistant", "content": episode.value if answer is None else answer},
    ]
