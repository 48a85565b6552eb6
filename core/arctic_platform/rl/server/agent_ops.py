"""``AgentOps``: agent sessions of sampling jobs, as the ``RLServer`` serves them.

Operations (``open_session``, ``list_sessions``, ``close_session``, ``session_trajectory``)
come through the operations table; the OpenAI-compatible turns (``chat_completion``,
``completion``, ``token_generate``, ``models``) are called by the session routes (the http
transport's app, or ``SessionHTTPServer`` beside a transport that is not HTTP). Each turn
plans its prompt ids with the session (token-faithful), samples through the server's
``generate`` and records what came back. Expired sessions are gone (404).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from arctic_platform.rl import wire
from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.history import content_text
from arctic_platform.rl.agents.journal import SessionJournal
from arctic_platform.rl.agents.models import SampledChoice, SessionTurn
from arctic_platform.rl.agents.openai_api import (
    ChatCompletionBody,
    TokenGenerateBody,
    chat_response,
    chat_sampling_params,
    check_chat,
    fit_max_tokens,
    generate_response,
    parse_body,
)
from arctic_platform.rl.agents.openai_completions import (
    CompletionBody,
    check_completion,
    completion_prompt_ids,
    completion_response,
    completion_sampling_params,
)
from arctic_platform.rl.agents.openai_stream import chat_chunks
from arctic_platform.rl.agents.session import AgentSession
from arctic_platform.rl.agents.store import SessionStore
from arctic_platform.rl.agents.tool_calls import ParsedCompletion
from arctic_platform.rl.agents.turns import PromptPlan
from arctic_platform.rl.errors import BadRequestError, InvalidRequestError, NotFoundError
from arctic_platform.rl.observe.server_metrics import record_sessions_open, record_turn
from arctic_platform.rl.server.job_state import Job

logger = logging.getLogger(__name__)

SESSION_PATH = "/s/{sid}/v1"
CPU_CONTEXT_CAP = 4096
"""The sampling engine's context on CPU when the config sets none (``vllm_common``)."""

Generate = Callable[[wire.GenerateRequest], dict[str, Any]]


class JobLookup(Protocol):
    """What sessions need of the job manager: a job by id (404 when unknown)."""

    def get(self, job_id: int) -> Job: ...


def _model_context(model_dir: str, job_config: dict[str, Any]) -> int | None:
    """The sampling job's context: ``vllm_config.max_model_len``, else the model's own
    (``max_position_embeddings``) capped at the CPU engine's default (the engine still
    refuses a longer prompt by its own limit)."""
    vllm = job_config.get("vllm_config") or {}
    if isinstance(vllm, dict) and vllm.get("max_model_len"):
        return int(vllm["max_model_len"])
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    positions = config.get("max_position_embeddings")
    return min(positions, CPU_CONTEXT_CAP) if isinstance(positions, int) else None


class AgentOps:
    """Sessions on the server's sampling jobs; ``generate`` is ``RLServer.generate``.

    With a ``journal`` every session is also kept on disk, and ``load_previous`` brings
    an earlier server's sessions back (``serve --resume``)."""

    def __init__(
        self, jobs: JobLookup, generate: Generate, journal: SessionJournal | None = None
    ) -> None:
        self.jobs = jobs
        self.journal = journal
        self._generate = generate
        self._tokenizers: dict[str, ChatTokenizer] = {}
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self.store = SessionStore(self._tokenizer)
        self._job_of: dict[str, int] = {}
        self._by_key: dict[str, str] = {}
        self._context: dict[int, int | None] = {}
        self.http_root: str | None = None
        """Where the session routes are served when the transport is not HTTP (set by it)."""

    def _tokenizer(self, model: str) -> ChatTokenizer:
        # one load at a time: sessions opened together on a fresh server imported
        # transformers from several threads at once ("cannot import name AutoTokenizer")
        with self._load_lock:
            with self._lock:
                known = self._tokenizers.get(model)
            if known is not None:
                return known
            try:
                tokenizer = ChatTokenizer.from_pretrained(model)
            except (OSError, ValueError) as exc:
                raise InvalidRequestError(f"no chat tokenizer for {model!r}: {exc}") from None
            with self._lock:
                self._tokenizers[model] = tokenizer
            return tokenizer

    def _session(self, session_id: str) -> AgentSession:
        for gone in self.store.expire():
            self._forget(gone)
        return self.store.get(session_id)

    def load_previous(self, resume: bool) -> int:
        """With ``resume``, take back the journaled sessions whose sampling job is still
        there and not ended (turns, key, settings; expiry counted from now); without it,
        forget them. Returns how many came back."""
        if self.journal is None:
            return 0
        if not resume:
            self.journal.clear()
            return 0
        back = 0
        for saved in self.journal.load():
            sid = saved.state.session_id
            try:
                job = self.jobs.get(saved.job_id)
                if job.state.terminal:
                    raise NotFoundError(f"its sampling job {saved.job_id} has ended")
                self.store.restore(saved.state, saved.key)
            except Exception as exc:
                logger.warning("agent session %s is not brought back: %s", sid, exc)
                self.journal.closed(sid)
                continue
            self._register(sid, saved.key, saved.job_id)
            back += 1
        if back:
            logger.info("brought back %d agent session(s) of the earlier server", back)
        return back

    def _register(self, session_id: str, key: str, job_id: int) -> None:
        self._job_of[session_id] = job_id
        self._by_key[key] = session_id

    def _forget(self, session_id: str) -> None:
        if self.journal is not None:
            self.journal.closed(session_id)
        self._job_of.pop(session_id, None)
        for key, sid in list(self._by_key.items()):
            if sid == session_id:
                self._by_key.pop(key, None)
        record_sessions_open(len(self._job_of))

    # --- operations ------------------------------------------------------------------------

    def open_session(self, request: wire.OpenSessionRequest) -> dict[str, Any]:
        """A new session on a sampling job: ``session_id``, ``key``, ``base_url_path`` and
        ``http_root`` (None when the transport itself is HTTP: the client knows its address)."""
        job = self.jobs.get(request.job_id)
        if job.job_type != "sampling":
            raise InvalidRequestError(f"job {job.job_id} is a {job.job_type} job, not sampling")
        model = str(job.config.get("model_name") or "")
        opened = self.store.open(model, max_staleness=request.max_staleness, ttl=request.ttl)
        self._register(opened.session_id, opened.key, job.job_id)
        state = self.store.get(opened.session_id).state
        if self.journal is not None:
            self.journal.opened(state, opened.key, job.job_id)
        record_sessions_open(len(self._job_of))
        return {
            "session_id": opened.session_id,
            "key": opened.key,
            "job_id": job.job_id,
            "model": model,
            "base_url_path": SESSION_PATH.format(sid=opened.session_id),
            "expires_at": state.expires_at,
            "http_root": self.http_root,
        }

    def list_sessions(self, request: wire.ListSessionsRequest) -> dict[str, Any]:
        """Every open session (of ``job_id`` when given): ids, models, turn counts, expiry."""
        for gone in self.store.expire():
            self._forget(gone)
        out = []
        for state in self.store.list():
            job_id = self._job_of.get(state.session_id)
            if request.job_id is not None and job_id != request.job_id:
                continue
            turns = len(self.store.get(state.session_id).state.turns)
            out.append(
                {
                    "session_id": state.session_id,
                    "job_id": job_id,
                    "model": state.model,
                    "turns": turns,
                    "max_staleness": state.max_staleness,
                    "created_at": state.created_at,
                    "expires_at": state.expires_at,
                }
            )
        return {"sessions": out}

    def close_session(self, request: wire.SessionRequest) -> dict[str, Any]:
        """Close a session (its trajectory goes with it); answers its turn count."""
        self._session(request.session_id)
        state = self.store.close(request.session_id)
        self._forget(request.session_id)
        return {"session_id": state.session_id, "closed": True, "turns": len(state.turns)}

    def session_trajectory(self, request: wire.SessionRequest) -> dict[str, Any]:
        """The session's turns and merged rows (``Trajectory``), and ``batch``: the rows as the
        ``Batch`` fields ``fwd_bwd`` takes (input_ids, loss_mask, old_log_probs)."""
        trajectory = self._session(request.session_id).trajectory()
        return {**trajectory.model_dump(mode="json"), "batch": trajectory.batch_fields()}

    # --- session routes --------------------------------------------------------------------

    def session_for_key(self, key: str | None) -> str | None:
        """The id of the open session whose key is ``key``, or None."""
        return self._by_key.get(key) if key else None

    def authorize(self, session_id: str, key: str | None) -> None:
        """404 unless ``session_id`` is open (and ``key``, when given, is its key)."""
        self._session(session_id)
        self.store.get(session_id, key)

    def _job_id(self, session_id: str) -> int:
        job_id = self._job_of.get(session_id)
        if job_id is None:
            raise NotFoundError(f"no agent session {session_id!r}")
        return job_id

    def _context_of(self, session: AgentSession, job_id: int) -> int | None:
        """The sampling job's context in tokens (None: unknown)."""
        if job_id not in self._context:
            job = self.jobs.get(job_id)
            self._context[job_id] = _model_context(session.state.model, job.config)
        return self._context[job_id]

    def _check_rough_length(self, session: AgentSession, job_id: int, texts: list[str]) -> None:
        """400 at once when ``texts`` cannot fit the context however they tokenize (a lower
        bound on their tokens, found without tokenizing): a huge message costs no tokenizer
        time before its answer."""
        context = self._context_of(session, job_id)
        if context is None:
            return
        fewest = sum(session.tokenizer.fewest_tokens(text) for text in texts)
        if fewest >= context:
            chars = sum(len(text) for text in texts)
            raise BadRequestError(
                f"the prompt is at least {fewest} tokens ({chars} characters); the model's "
                f"context is {context} (max_model_len), with at least one token to generate"
            )

    def _room(self, session: AgentSession, job_id: int, prompt: int) -> int | None:
        """Tokens left after a ``prompt``-token prompt; 400 when none are."""
        context = self._context_of(session, job_id)
        if context is None:
            return None
        if prompt >= context:
            raise BadRequestError(
                f"the prompt is {prompt} tokens; the model's context is {context} "
                "(max_model_len), with at least one token to generate"
            )
        return context - prompt

    def _check_staleness(self, session: AgentSession, job_id: int) -> None:
        limit = session.state.max_staleness
        turns = session.state.turns
        if limit is None or not turns or turns[0].weight_version_start is None:
            return
        now = self.jobs.get(job_id).weight_version
        if now - turns[0].weight_version_start > limit:
            raise BadRequestError(
                f"session {session.state.session_id} began on weight version "
                f"{turns[0].weight_version_start}; version {now} is past its max_staleness "
                f"of {limit}"
            )

    def _sample(
        self, job_id: int, prompt: list[int], params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The engine's completion records for ``prompt`` (``params["n"]`` of them)."""
        answer = self._generate(
            wire.GenerateRequest(job_id=job_id, prompts=[prompt], sampling_params=params)
        )
        return [dict(c) for c in answer["outputs"][0]["completions"]]

    def _record(
        self,
        session: AgentSession,
        plan: PromptPlan,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        completions: list[dict[str, Any]],
    ) -> list[tuple[SessionTurn, ParsedCompletion, dict[str, Any]]]:
        """Record the request's choices as sibling turns: (turn, parsed, completion) each."""
        sampled = [SampledChoice.from_engine(c) for c in completions]
        recorded = session.record_choices(plan, messages, tools, sampled)
        self.store.touch(session.state.session_id)
        for _ in recorded:
            record_turn(new_segment=plan.parent is None, prefix_break=plan.prefix_break)
        if self.journal is not None:
            self.journal.recorded(session.state, [turn for turn, _ in recorded])
        return [(t, p, c) for (t, p), c in zip(recorded, completions, strict=True)]

    def _chat_turn(
        self, session_id: str, body: Any
    ) -> tuple[ChatCompletionBody, AgentSession, list[tuple[Any, ...]]]:
        """Sample and record one chat request: (request, session, its choices)."""
        session = self._session(session_id)
        job_id = self._job_id(session_id)
        request: ChatCompletionBody = parse_body(ChatCompletionBody, body)
        check_chat(request)
        self._check_staleness(session, job_id)
        texts = [content_text(m.get("content")) for m in request.messages]
        self._check_rough_length(session, job_id, texts)
        try:
            plan = session.prompt(request.messages, request.tools)
        except Exception as exc:  # the chat template refused the messages
            raise BadRequestError(f"the messages cannot be rendered: {exc}") from None
        room = self._room(session, job_id, len(plan.prompt_ids))
        params = chat_sampling_params(request, session.tokenizer, room)
        completions = self._sample(job_id, plan.prompt_ids, params)
        choices = self._record(session, plan, request.messages, request.tools, completions)
        return request, session, choices

    def chat_completion(self, session_id: str, body: Any) -> dict[str, Any]:
        """One ``/chat/completions`` request of a session (OpenAI's answer shape; ``n``
        choices recorded as sibling turns)."""
        request, session, choices = self._chat_turn(session_id, body)
        return chat_response(
            request,
            [(turn, completion) for turn, _, completion in choices],
            session.tokenizer,
            session_id=session_id,
            model=session.state.model,
        )

    def chat_completion_chunks(self, session_id: str, body: Any) -> list[dict[str, Any]]:
        """One streamed ``/chat/completions`` turn: sampled and recorded whole, then given as
        its ``chat.completion.chunk``s (``openai_stream``; ``n`` is 1)."""
        request, session, choices = self._chat_turn(session_id, body)
        ((turn, parsed, completion),) = choices
        return chat_chunks(
            request,
            turn,
            parsed,
            completion,
            session.tokenizer,
            session_id=session_id,
            model=session.state.model,
        )

    def _token_turn(
        self, session: AgentSession, job_id: int, prompt: list[int], params: dict[str, Any]
    ) -> list[tuple[SessionTurn, dict[str, Any]]]:
        """Sample and record a request whose prompt the client gave as ids: it continues the
        segment of the turn whose prompt and completion it starts with (any earlier turn),
        else it starts a new one (marked ``prefix_break`` after the first)."""
        plan = session.prompt_ids(prompt)
        completions = self._sample(job_id, prompt, params)
        return [(t, c) for t, _, c in self._record(session, plan, [], None, completions)]

    def token_generate(self, session_id: str, body: Any) -> dict[str, Any]:
        """One token-in ``/inference/v1/generate`` request (vLLM's answer shape)."""
        session = self._session(session_id)
        job_id = self._job_id(session_id)
        request: TokenGenerateBody = parse_body(TokenGenerateBody, body)
        self._check_staleness(session, job_id)
        prompt = [int(i) for i in request.token_ids]
        room = self._room(session, job_id, len(prompt))
        params = dict(request.sampling_params)
        params.setdefault("n", 1)
        asked = params.get("max_tokens")
        if asked is None or (isinstance(asked, int) and not isinstance(asked, bool)):
            fitted = fit_max_tokens(asked, room)  # else the engine names the bad value
            if fitted is not None:
                params["max_tokens"] = fitted
        choices = self._token_turn(session, job_id, prompt, params)
        return generate_response(
            choices, session.tokenizer, session_id=session_id, model=session.state.model
        )

    def completion(self, session_id: str, body: Any) -> dict[str, Any]:
        """One legacy ``/completions`` request: a text prompt (encoded as written) or token
        ids, recorded like a token-in request (OpenAI's ``text_completion`` answer)."""
        session = self._session(session_id)
        job_id = self._job_id(session_id)
        request: CompletionBody = parse_body(CompletionBody, body)
        check_completion(request)
        self._check_staleness(session, job_id)
        if isinstance(request.prompt, str):
            self._check_rough_length(session, job_id, [request.prompt])
        prompt = completion_prompt_ids(request, session.tokenizer)
        room = self._room(session, job_id, len(prompt))
        params = completion_sampling_params(request, room)
        choices = self._token_turn(session, job_id, prompt, params)
        return completion_response(
            request,
            choices,
            session.tokenizer,
            session_id=session_id,
            model=session.state.model,
        )

    def models(self, session_id: str) -> dict[str, Any]:
        """OpenAI's model list: the session's model with its ``max_model_len``."""
        session = self._session(session_id)
        job_id = self._job_id(session_id)
        entry = {
            "id": session.state.model,
            "object": "model",
            "created": int(session.state.created_at),
            "owned_by": "arctic-rl",
            "max_model_len": self._context_of(session, job_id),
        }
        return {"object": "list", "data": [entry]}


__all__ = ["SESSION_PATH", "AgentOps"]
