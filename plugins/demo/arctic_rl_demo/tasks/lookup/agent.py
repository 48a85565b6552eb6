"""Lookup episodes played by a real openai-agents ``Agent`` + ``Runner`` against agent sessions.

Each episode opens its own session on the run's sampling job, points an ``AsyncOpenAI``
client at the session's URL, and runs an agent whose one tool, ``lookup``, knows one key: the
episode's (any other key gets ``unknown key``, so the reward needs the right key). Turn 1 uses
``tool_choice="required"`` (the server constrains it to a well-formed call; openai-agents then
resets the choice, so turn 2 answers freely). The session keeps every turn's sampled ids and
log-probs; its trajectory ``batch`` is what GRPO trains on. openai-agents, openai and httpx are
imported here only, when an episode runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arctic_rl_demo.tasks.lookup.task import INSTRUCTIONS, TOOL_DESCRIPTION, Episode, LookupTask

SESSION_TTL_SECONDS = 900.0
HTTP_TIMEOUT_SECONDS = 600.0


@dataclass
class EpisodeResult:
    """What one agent run did: its session, the key it looked up, its answer and reward."""

    episode: Episode
    session_id: str
    called_key: str | None = None
    final_output: str | None = None
    reward: float = 0.0
    error: str | None = None
    batch: dict[str, Any] = field(default_factory=dict)

    @property
    def key_right(self) -> bool:
        """Whether the agent called ``lookup`` with the episode's key."""
        return self.called_key == self.episode.key


UNKNOWN_KEY = "unknown key"


def lookup_tool(episode: Episode, calls: list[str]) -> Any:
    """An openai-agents function tool named ``lookup`` that records each key it is called with
    and returns the episode's value for the episode's key, ``unknown key`` for any other.

    (A first version returned the value whatever the key: GRPO then learned to call lookup
    with a wrong key, 0.0 held-out right keys at 1.0 success.)"""
    import agents

    def lookup(key: str) -> str:
        calls.append(key)
        return episode.value if key == episode.key else UNKNOWN_KEY

    lookup.__doc__ = TOOL_DESCRIPTION
    return agents.function_tool(lookup)


class AgentPlayer:
    """Plays episodes through sessions of ``client`` (an ``AsyncArcticRLClient``)."""

    def __init__(self, client: Any, task: LookupTask, max_tokens: int) -> None:
        import agents
        import httpx

        agents.set_tracing_disabled(True)  # no traces are posted anywhere
        self.client = client
        self.task = task
        self.max_tokens = max_tokens
        self.warm = False
        self.http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS, trust_env=False)

    async def aclose(self) -> None:
        """Close the shared HTTP connection pool."""
        await self.http.aclose()

    def _agent(self, handle: Any, tool: Any, temperature: float) -> Any:
        import agents
        from openai import AsyncOpenAI

        if handle.base_url is None:
            raise ValueError("the lookup demo needs the http transport (sessions have no URL)")
        openai_client = AsyncOpenAI(
            base_url=handle.base_url,
            api_key=handle.api_key,
            max_retries=0,
            http_client=self.http,
        )
        model = agents.OpenAIChatCompletionsModel(model=handle.model, openai_client=openai_client)
        settings = agents.ModelSettings(
            tool_choice="required", max_tokens=self.max_tokens, temperature=temperature
        )
        return agents.Agent(
            name="lookup-agent",
            instructions=INSTRUCTIONS,
            tools=[tool],
            model=model,
            model_settings=settings,
        )

    async def play(self, episode: Episode, temperature: float, keep_batch: bool) -> EpisodeResult:
        """Run one episode in a fresh session, score it, read its trajectory, close it."""
        import agents
        import openai

        handle = await self.client.open_session(ttl=SESSION_TTL_SECONDS)
        result = EpisodeResult(episode, handle.session_id)
        calls: list[str] = []
        try:
            agent = self._agent(handle, lookup_tool(episode, calls), temperature)
            run = await agents.Runner.run(agent, episode.prompt, max_turns=2)
            result.final_output = str(run.final_output)
            result.reward = self.task.reward(run.final_output, episode.value)
        except (agents.AgentsException, openai.OpenAIError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:200]
        result.called_key = calls[0] if calls else None
        try:
            if keep_batch:
                trajectory = await self.client.session_trajectory(handle.session_id)
                result.batch = dict(trajectory.get("batch") or {})
        finally:
            await self.client.close_session(handle.session_id)
        return result

    async def play_all(
        self,
        episodes: list[Episode],
        temperature: float,
        keep_batch: bool,
        on_done: Callable[[EpisodeResult], None] | None = None,
    ) -> list[EpisodeResult]:
        """Play ``episodes`` concurrently, in order (the very first one alone: the server
        loads a session's chat tokenizer on first use, and concurrent first uses raced on
        the ``transformers`` import with an HTTP 500)."""

        async def one(e: Episode) -> EpisodeResult:
            r = await self.play(e, temperature, keep_batch)
            if on_done is not None:
                on_done(r)
            return r

        head: list[EpisodeResult] = []
        if not self.warm and episodes:
            head = [await one(episodes[0])]
            episodes = episodes[1:]
            self.warm = True
        return head + list(await asyncio.gather(*(one(e) for e in episodes)))
