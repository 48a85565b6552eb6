"""The request loop of a vLLM sampling engine: one thread owns the ``LLMEngine`` and steps it.

``submit`` (any thread) queues one generate call's requests; the loop adds every queued call
between two engine steps, so concurrent calls share batches, and hands each call its own
outputs when all of its requests have finished. ``run`` executes a function in the loop
thread between two steps: ``when="idle"`` first stops admitting calls and lets the running
requests finish (a drain), ``when="now"`` runs it with requests still in flight (a hotswap).
Every wait has a timeout (``timeout``; by default the server's operation timeout): a timed-out
call's requests are aborted in vLLM, a timed-out task that has not started is dropped.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from arctic_platform.rl.api import EngineError, InvalidRequestError

logger = logging.getLogger(__name__)

When = Literal["now", "idle"]
OP_TIMEOUT_ENV = "ARCTIC_RL_OP_TIMEOUT"  # set by the server in each worker: its --op-timeout
DEFAULT_TIMEOUT = 900.0  # seconds; the server's default operation timeout


def op_timeout() -> float:
    """Seconds an engine call may wait: ``$ARCTIC_RL_OP_TIMEOUT``, else ``DEFAULT_TIMEOUT``."""
    try:
        value = float(os.environ.get(OP_TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def _refusal(exc: Exception) -> Exception:
    """What a request vLLM refused fails its call with: a 422 when vLLM blames the request
    (e.g. a constraint it cannot compile), an ``EngineError`` otherwise."""
    blamed: tuple[type[BaseException], ...] = (InvalidRequestError,)
    try:
        from vllm.exceptions import VLLMClientError

        blamed += (VLLMClientError,)
    except ImportError:  # pragma: no cover - an older vLLM
        pass
    message = f"vLLM refused a request of this generate call: {exc}"
    if isinstance(exc, blamed):
        return InvalidRequestError(message)
    return EngineError(message)


class _Call:
    """One generate call: its prompts, params and LoRA requests, then its outputs in order."""

    def __init__(
        self, number: int, prompts: list[Any], params: list[Any], loras: list[Any] | None = None
    ) -> None:
        self.number = number
        self.prompts = prompts
        self.params = params
        self.loras = loras if loras is not None else [None] * len(prompts)
        self.request_ids = [f"{number}.{i}" for i in range(len(prompts))]
        self.outputs: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.done = threading.Event()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


class _Task:
    """A function to run in the loop thread, and its result."""

    def __init__(self, function: Callable[[], Any], when: When) -> None:
        self.function = function
        self.when = when
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()


@dataclass
class LoopStats:
    """What the loop has done: engine steps, and how many calls and requests shared a step."""

    steps: int = 0
    calls_submitted: int = 0
    calls_answered: int = 0
    max_calls_in_step: int = 0
    max_requests_in_step: int = 0
    steps_shared: int = 0  # steps whose batch held requests of two calls or more
    tasks_run: int = 0
    errors: list[str] = field(default_factory=list)
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=1024))
    """``(step, calls, requests)`` of the latest steps: who shared each batch."""

    def as_dict(self) -> dict[str, Any]:
        """A copy as plain data."""
        skip = ("errors", "recent")  # the latest errors only; no step history
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        return {**counts, "errors": list(self.errors[-10:])}


class GenerationLoop:
    """One thread that owns a vLLM ``LLMEngine``: admits calls between steps, runs tasks."""

    def __init__(
        self,
        engine: Any,
        name: str = "vllm-loop",
        ready: Callable[[], Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        self._engine = engine
        self.timeout = op_timeout() if timeout is None else timeout  # default of every wait
        self._ready = ready  # raises when the engine may not take requests now (asleep)
        self._cond = threading.Condition()
        self._queued: deque[_Call] = deque()
        self._tasks: deque[_Task] = deque()
        self._calls: dict[int, _Call] = {}  # admitted calls, by number
        self._owner: dict[str, _Call] = {}  # unfinished request id -> its call
        self._held = 0
        self._closed: str | None = None
        self._numbers = itertools.count()
        self.stats = LoopStats()
        import torch

        # a new thread starts with OpenMP's default thread count; the engine was built (and
        # its CPU attention metadata sized) with the creating thread's count: keep it
        self._torch_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- any thread -------------------------------------------------------------------

    def submit(
        self, prompts: list[Any], params: list[Any], loras: list[Any] | None = None
    ) -> _Call:
        """Queue one call (one ``SamplingParams`` and one LoRA request or None per prompt);
        ``wait`` gives its outputs."""
        from vllm.sampling_params import RequestOutputKind

        for p in params:
            p.output_kind = RequestOutputKind.FINAL_ONLY
        if loras is not None and len(loras) != len(prompts):
            raise EngineError(f"{len(prompts)} prompts but {len(loras)} LoRA requests")
        with self._cond:
            self._check_open()
            call = _Call(next(self._numbers), prompts, params, loras)
            self._queued.append(call)
            self.stats.calls_submitted += 1
            self._cond.notify_all()
        return call

    def wait(self, call: _Call, timeout: float | None = None) -> list[Any]:
        """The call's ``RequestOutput``s in prompt order; raises what failed it.

        After ``timeout`` s (default ``self.timeout``) its requests are aborted in vLLM and
        it fails with ``EngineError``."""
        timeout = self.timeout if timeout is None else timeout
        if not call.done.wait(timeout):
            self._abort(call, EngineError(f"generate did not finish within {timeout} s"))
            call.done.wait()
        if call.error is not None:
            raise call.error
        return [call.outputs[rid] for rid in call.request_ids]

    def run(
        self, function: Callable[[], Any], when: When = "now", timeout: float | None = None
    ) -> Any:
        """Run ``function`` in the loop thread between two steps and return its result.

        ``idle``: no call is admitted meanwhile and the running requests finish first. After
        ``timeout`` s (default ``self.timeout``) an ``EngineError``: a task not started yet
        is dropped, one already running finishes in the loop thread unobserved.
        """
        timeout = self.timeout if timeout is None else timeout
        task = _Task(function, when)
        with self._cond:
            self._check_open()
            self._tasks.append(task)
            self._cond.notify_all()
        if not task.done.wait(timeout):
            with self._cond:
                queued = task in self._tasks
                if queued:
                    self._tasks.remove(task)
                    self._cond.notify_all()
            if queued:
                raise EngineError(
                    f"a task ({when}) waited {timeout} s for the vLLM loop and was dropped "
                    f"(running requests: {self.counts()['running_requests']})"
                )
            if not task.done.is_set():
                raise EngineError(f"a task ({when}) of the vLLM loop ran longer than {timeout} s")
        if task.error is not None:
            raise task.error
        return task.result

    @contextmanager
    def hold(self) -> Iterator[None]:
        """While held the loop neither steps nor admits nor runs tasks (calls stay queued)."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def counts(self) -> dict[str, int]:
        """Calls queued and admitted, unfinished requests, tasks waiting: a snapshot."""
        with self._cond:
            return {
                "queued_calls": len(self._queued),
                "running_calls": len(self._calls),
                "running_requests": len(self._owner),
                "tasks": len(self._tasks),
                "steps": self.stats.steps,
            }

    def close(self, reason: str = "the vLLM engine was closed") -> None:
        """Stop the thread; every waiting call and task fails with ``EngineError(reason)``."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)
        self._fail_everything(EngineError(reason))

    @property
    def closed(self) -> bool:
        """True once ``close`` was called."""
        return self._closed is not None

    # --- the loop thread --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise EngineError(self._closed)

    def _run(self) -> None:
        try:
            import torch

            if torch.get_num_threads() != self._torch_threads:
                torch.set_num_threads(self._torch_threads)
            self._loop()
        except BaseException as exc:  # a bug in the loop itself: say so to every waiter
            logger.exception("the vLLM generation loop stopped")
            with self._cond:
                self._closed = self._closed or f"the vLLM generation loop stopped: {exc!r}"
        self._fail_everything(EngineError(self._closed or "the vLLM engine was closed"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._closed is None and (
                    self._held or not (self._queued or self._tasks or self._owner)
                ):
                    self._cond.wait()
                if self._closed is not None:
                    break
                task = self._tasks[0] if self._tasks else None
                if task is not None and (task.when == "now" or not self._owner):
                    self._tasks.popleft()
                else:
                    task = None
                draining = bool(self._tasks) or task is not None
                admit = [] if draining else list(self._queued)
                if admit:
                    self._queued.clear()
            if task is not None:
                self._run_task(task)
                continue
            for call in admit:
                self._admit(call)
            if self._owner:
                self._step()

    def _run_task(self, task: _Task) -> None:
        try:
            task.result = task.function()
        except BaseException as exc:  # handed to the caller, the loop goes on
            task.error = exc
        finally:
            self.stats.tasks_run += 1
            task.done.set()

    def _admit(self, call: _Call) -> None:
        """Add one call's requests; a request vLLM refuses fails that call only."""
        added: list[str] = []
        if self._ready is not None:
            try:
                self._ready()
            except Exception as exc:  # e.g. put to sleep after this call was checked
                call.fail(exc)
                return
        try:
            for rid, prompt, params, lora in zip(
                call.request_ids, call.prompts, call.params, call.loras, strict=True
            ):
                self._engine.add_request(rid, prompt, params, lora_request=lora)
                added.append(rid)
        except Exception as exc:
            if added:
                self._engine.abort_request(added, internal=False)
            self._record(f"add_request: {exc}")
            call.fail(_refusal(exc))
            return
        with self._cond:
            self._calls[call.number] = call
            for rid in added:
                self._owner[rid] = call

    def _step(self) -> None:
        """One engine step; finished outputs go to their calls. A failed step fails the calls
        whose requests were running, and the loop goes on."""
        with self._cond:
            running = {id(c): c for c in self._owner.values()}
            requests = len(self._owner)
        stats = self.stats
        stats.steps += 1
        stats.max_calls_in_step = max(stats.max_calls_in_step, len(running))
        stats.max_requests_in_step = max(stats.max_requests_in_step, requests)
        if len(running) > 1:
            stats.steps_shared += 1
        stats.recent.append((stats.steps, len(running), requests))
        try:
            outputs = self._engine.step()
        except Exception as exc:
            logger.exception("vLLM engine step failed")
            self._record(f"step: {exc}")
            for call in running.values():
                self._abort(call, EngineError(f"vLLM failed while generating: {exc}"))
            return
        for output in outputs:
            if not output.finished:
                continue
            with self._cond:
                call = self._owner.pop(output.request_id, None)
            if call is None:
                continue
            call.outputs[output.request_id] = output
            if len(call.outputs) == len(call.request_ids):
                with self._cond:
                    self._calls.pop(call.number, None)
                stats.calls_answered += 1
                call.done.set()

    def _abort(self, call: _Call, error: BaseException) -> None:
        """Drop a call's unfinished requests from vLLM and fail it."""
        with self._cond:
            rids = [rid for rid, owner in self._owner.items() if owner is call]
            for rid in rids:
                del self._owner[rid]
            self._calls.pop(call.number, None)
            try:
                self._queued.remove(call)
            except ValueError:
                pass
        if rids and threading.current_thread() is self._thread:
            try:
                self._engine.abort_request(rids, internal=False)
            except Exception as exc:  # the engine may be the thing that broke
                self._record(f"abort: {exc}")
        elif rids:
            self._abort_later(rids)
        call.fail(error)

    def _abort_later(self, rids: list[str]) -> None:
        """Abort requests from another thread: as a task, so only the loop touches vLLM."""
        task = _Task(lambda: self._engine.abort_request(rids, internal=False), "now")
        with self._cond:
            if self._closed is None:
                self._tasks.appendleft(task)
                self._cond.notify_all()

    def _fail_everything(self, error: EngineError) -> None:
        with self._cond:
            calls = list(self._queued) + list(self._calls.values())
            tasks = list(self._tasks)
            self._queued.clear()
            self._calls.clear()
            self._owner.clear()
            self._tasks.clear()
        for call in calls:
            call.fail(error)
        for task in tasks:
            if not task.done.is_set():
                task.error = error
                task.done.set()

    def _record(self, message: str) -> None:
        self.stats.errors.append(message[:300])
