"""``ArcticRLClient`` (blocking) and ``AsyncArcticRLClient``: the one client an RL loop uses.

A new client starts its backend (local: reach or launch the server), then creates the jobs
in the order sampling, log-prob, training and waits for each to run. With job ids in the
config it reattaches to running jobs instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, Unpack

from arctic_platform.rl.agents.client_sessions import SessionMethods
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import JobError, JobStateError, ServerError, TransportError
from arctic_platform.rl.interfaces import Backend, ClientTransport, ServedAdapter

logger = logging.getLogger(__name__)

JOB_ORDER = ("sampling", "log_prob", "training")
T = TypeVar("T")


def _gpus(config: ArcticRLClientConfig, job_type: str) -> int:
    return int(getattr(config, f"{job_type}_gpus"))


def _adapter_fields(
    adapter: str | None = None, adapter_version: int | None = None
) -> dict[str, Any]:
    """The ``adapter``/``adapter_version`` request fields that are set."""
    fields = {"adapter": adapter, "adapter_version": adapter_version}
    return {k: v for k, v in fields.items() if v is not None}


def _memory_call(
    operation: str, job_type: str, doc: str
) -> Callable[[ArcticRLClient], dict[str, Any]]:
    """The ``ArcticRLClient`` method calling sleep/wake ``operation`` on its ``job_type`` job."""

    def call(self: ArcticRLClient) -> dict[str, Any]:
        return dict(self._call_job(operation, job_type))

    call.__doc__ = doc
    return call


class ArcticRLClient(SessionMethods):
    """Drives the training, sampling and log-prob jobs of one RL run."""

    def __init__(
        self, config: ArcticRLClientConfig | dict[str, Any], *, progress: bool = True
    ) -> None:
        from arctic_platform.rl.plugins import get_registry

        self.config = (
            config
            if isinstance(config, ArcticRLClientConfig)
            else ArcticRLClientConfig.model_validate(config)
        )
        self.progress = progress
        self.job_ids: dict[str, int | None] = {t: None for t in JOB_ORDER}
        self._closed = False
        self.backend: Backend = get_registry().get("backend", self.config.backend).create()
        self.transport: ClientTransport = self.backend.start(self.config)
        self.owns_jobs = not self.config.reconnect_mode
        try:
            if self.config.reconnect_mode:
                self._attach_jobs()
            else:
                self._create_jobs()
        except BaseException:
            self.transport.close()
            raise

    # --- start-up -----------------------------------------------------------------------

    def _attach_jobs(self) -> None:
        """Attach to the configured job ids; jobs still starting (a resumed server) are awaited."""
        for job_type in JOB_ORDER:
            job_id = getattr(self.config, f"{job_type}_job_id")
            if job_id is None:
                continue
            info = self.transport.call("get_job", {"job_id": job_id})
            if info["job_type"] != job_type:
                raise JobError(f"{job_type}_job_id={job_id} is a {info['job_type']} job")
            if info["state"] in ("pending", "placing", "initializing"):
                self._wait_running(job_type, job_id)
            elif info["state"] != "running":
                failed = info["state"] == "failed"
                hint = " (restart_job brings a failed job back)" if failed else ""
                raise JobStateError(
                    f"cannot reconnect: {job_type} job {job_id} is {info['state']}"
                    + (f" ({info['reason']})" if info.get("reason") else "")
                    + hint
                )
            self.job_ids[job_type] = job_id

    def _create_jobs(self) -> None:
        """Ask for every job first, so their engines start side by side, then await each."""
        payload = self.config.initialize_payload()
        try:
            for job_type in JOB_ORDER:
                if _gpus(self.config, job_type) <= 0:
                    continue
                answer = self.transport.call(
                    "initialize", {"job_type": job_type, "config": payload}
                )
                self.job_ids[job_type] = int(answer["job_id"])
            for job_type in JOB_ORDER:
                job_id = self.job_ids[job_type]
                if job_id is not None:
                    self._wait_running(job_type, job_id)
        except BaseException:
            self._destroy_jobs()
            raise

    def _wait_running(self, job_type: str, job_id: int) -> None:
        timeout = self.config.job_ready_timeout
        deadline = time.monotonic() + timeout
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=None,
                desc=f"{job_type} job {job_id}: pending",
                file=sys.stderr,
                bar_format="{desc} [{elapsed}]",
                leave=True,
            )
        try:
            while True:
                info = self.transport.call("get_job", {"job_id": job_id})
                state = info["state"]
                if bar is not None:
                    bar.set_description_str(f"{job_type} job {job_id}: {state}")
                if state == "running":
                    return
                if state in ("failed", "cancelled", "terminated"):
                    raise JobError(f"{job_type} job {job_id} is {state}: {info.get('reason')}")
                if time.monotonic() > deadline:
                    raise JobError(
                        f"{job_type} job {job_id} was still {state} after "
                        f"job_ready_timeout={timeout}s"
                    )
                time.sleep(min(1.0, self.config.health_check_interval))
        finally:
            if bar is not None:
                bar.close()

    def _destroy_jobs(self) -> None:
        for job_type in JOB_ORDER:
            job_id = self.job_ids.get(job_type)
            if job_id is not None:
                try:
                    self.transport.call("destroy", {"job_id": job_id})
                except Exception as exc:
                    logger.warning("could not destroy %s job %s: %s", job_type, job_id, exc)

    # --- helpers ------------------------------------------------------------------------

    def _job(self, job_type: str) -> int:
        if self._closed:
            raise JobError("this client is closed; create a new one (reconnect_config()) to go on")
        job_id = self.job_ids.get(job_type)
        if job_id is None:
            raise JobError(
                f"this client has no {job_type} job (set {job_type}_gpus > 0, or "
                f"{job_type}_job_id to reconnect)"
            )
        return job_id

    def _call_job(self, operation: str, job_type: str, **fields: Any) -> Any:
        """Call ``operation`` on this client's ``job_type`` job with ``fields`` besides its id."""
        return self.transport.call(operation, {"job_id": self._job(job_type), **fields})

    def _call_retrying(self, operation: str, payload: dict[str, Any], attempts: int = 3) -> Any:
        """Retry a call that carries a request id: the server applies it at most once."""
        for attempt in range(attempts):
            try:
                return self.transport.call(operation, payload)
            except TransportError as exc:
                if getattr(exc, "status_code", None) is not None or attempt == attempts - 1:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    # --- training -----------------------------------------------------------------------

    def fwd_bwd(
        self,
        batch: dict[str, Any],
        loss_fn: str = "grpo",
        loss_config: dict[str, Any] | None = None,
        request_id: str | None = None,
        *,
        return_log_probs: bool = False,
        forward_only: bool = False,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        """Forward/backward on the training job; metrics (``loss``, ``tokens``, ...).

        ``return_log_probs`` adds ``log_probs`` (per row, per token; entry 0 is 0.0);
        ``forward_only`` computes the same without a gradient. A batch may carry
        ``target_tokens`` (the token each position scores) and per-token ``weights``.

        A call repeated with the same ``request_id`` (default: a fresh one, also used by the
        client's own retries) returns the first result and applies no second gradient, also
        after ``serve --resume``; one whose gradient a restore to an earlier checkpoint undid
        is a ``ServerError`` with code ``rolled_back`` (docs/http-api.md, Faults).
        ``adapter``: in a LoRA run, the named adapter (``add_adapter``) it trains.
        """
        payload = {
            "job_id": self._job("training"),
            "batch": batch,
            "loss_fn": loss_fn,
            "loss_config": loss_config,
            "request_id": request_id or uuid.uuid4().hex,
        }
        if return_log_probs or forward_only:
            payload["return_log_probs"] = return_log_probs
            payload["forward_only"] = forward_only
        payload.update(_adapter_fields(adapter))
        return dict(self._call_retrying("fwd_bwd", payload))

    def fwd_no_grad(
        self, batch: dict[str, Any], reference_model: bool = False, *, adapter: str | None = None
    ) -> list[list[float]]:
        """Per-token log-probs from the training model (or its frozen reference copy; in a
        LoRA run of named ``adapter``)."""
        answer = self._call_job(
            "fwd_no_grad",
            "training",
            batch=batch,
            reference_model=reference_model,
            **_adapter_fields(adapter),
        )
        return list(answer["log_probs"])

    def step(
        self,
        learning_rate: float | None = None,
        request_id: str | None = None,
        *,
        beta1: float | None = None,
        beta2: float | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        grad_clip_norm: float | None = None,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        """One optimizer step: ``global_step``, ``lr``, ``grad_norm``, ``applied`` (False: no
        gradient was accumulated since the last step or load, and nothing changed).

        AdamW's ``beta1``, ``beta2``, ``eps``, ``weight_decay`` and ``grad_clip_norm`` (0: no
        clipping), when given, hold from this step on. Repeating it with the same
        ``request_id`` returns the first result without a second step (or code
        ``rolled_back`` when a restore to an earlier checkpoint undid that step). ``adapter``:
        in a LoRA run, the named adapter it steps (each has its own optimizer state and step).
        """
        payload: dict[str, Any] = {
            "job_id": self._job("training"),
            "learning_rate": learning_rate,
            "request_id": request_id or uuid.uuid4().hex,
        }
        adam = {
            "beta1": beta1,
            "beta2": beta2,
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_clip_norm": grad_clip_norm,
        }
        payload.update({k: v for k, v in adam.items() if v is not None})
        payload.update(_adapter_fields(adapter))
        return dict(self._call_retrying("step", payload))

    def save_checkpoint(self, tag: str | None = None, *, adapter: str | None = None) -> str:
        """Save the full training state (in a LoRA run: of ``adapter``); returns its path."""
        named = _adapter_fields(adapter)
        return str(self._call_job("save_checkpoint", "training", tag=tag, **named)["path"])

    def load_checkpoint(
        self,
        path: str | None = None,
        step: int | None = None,
        *,
        optimizer: bool = True,
        adapter: str | None = None,
    ) -> int:
        """Load a checkpoint (by path, by step, or the latest); returns the global step.

        ``optimizer=False`` restores the weights with a fresh optimizer; ``adapter`` (LoRA)
        is the named adapter it loads into."""
        fields: dict[str, Any] = {"path": path, "step": step, **_adapter_fields(adapter)}
        if not optimizer:
            fields["optimizer"] = False
        answer = self._call_job("load_checkpoint", "training", **fields)
        return int(answer["global_step"])

    def add_adapter(self, adapter: str, seed: int | None = None) -> list[str]:
        """A LoRA run: one more named adapter in the training job (it starts as the base, with
        its own optimizer state); returns the adapters the job trains."""
        answer = self._call_job("add_adapter", "training", adapter=adapter, seed=seed)
        return list(answer["adapters"])

    def remove_adapter(self, adapter: str) -> None:
        """A LoRA run: forget a named adapter in the training job and stop serving its
        versions in the sampling and log-prob jobs (those that have it)."""
        for job_type in ("training", "sampling", "log_prob"):
            if self.job_ids.get(job_type) is None:
                continue
            try:
                self._call_job("remove_adapter", job_type, adapter=adapter)
            except ServerError as exc:  # a job the adapter was never synced into holds none
                if job_type == "training" or exc.status_code != 404:
                    raise

    def empty_training_cache(self) -> None:
        """Release cached device memory on the training ranks."""
        self._call_job("empty_training_cache", "training")

    # --- inference ----------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: dict[str, Any] | None = None,
        **served: Unpack[ServedAdapter],
    ) -> dict[str, Any]:
        """Rollouts: ``outputs`` (per prompt: prompt_token_ids, completions), ``weight_version``.

        In a LoRA run (``training_config.lora``) the sampler serves ``adapter`` (default: the
        run's adapter at its latest synced version; ``"base"``: the base model) at
        ``adapter_version`` (default: its latest), and the answer names the ``adapter`` served.
        """
        params = sampling_params or {}
        fields = _adapter_fields(**served)
        return dict(
            self._call_job(
                "generate", "sampling", prompts=prompts, sampling_params=params, **fields
            )
        )

    def log_probs(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        top_k: int = 1,
        **served: Unpack[ServedAdapter],
    ) -> dict[str, Any]:
        """Per completion token log-probs (and top-k) from the log-prob job.

        In a LoRA run they are those of ``adapter`` at ``adapter_version`` (defaults and
        ``"base"`` as for ``generate``)."""
        fields = _adapter_fields(**served)
        return dict(
            self._call_job(
                "log_probs",
                "log_prob",
                prompts=prompts,
                completions=completions,
                top_k=top_k,
                **fields,
            )
        )

    def sync_weights(
        self,
        strategy: str = "drain",
        *,
        adapter: str | None = None,
        training_adapter: str | None = None,
    ) -> dict[str, Any]:
        """Copy the training weights into the sampling and log-prob jobs.

        ``strategy``: how the targets swap while requests are in flight (``"drain"``). In a
        LoRA run only the adapter moves, loaded as ``adapter`` (default: the run's adapter)
        at a new version, with no drain; the answer has ``weight_version``, ``adapter`` and
        ``bytes`` (the bytes moved). ``training_adapter`` names the trainer's adapter to send
        (default: the one it worked on last); ``adapter`` defaults to it."""
        payload: dict[str, Any] = {
            "training_job_id": self._job("training"),
            "sampling_job_ids": [j for j in [self.job_ids["sampling"]] if j is not None],
            "log_prob_job_ids": [j for j in [self.job_ids["log_prob"]] if j is not None],
            "strategy": strategy,
        }
        if adapter is not None:
            payload["adapter"] = adapter
        if training_adapter is not None:
            payload["training_adapter"] = training_adapter
        return dict(self.transport.call("sync_weights", payload))

    def weight_norm(self) -> dict[str, float]:
        """L2 norm of each job's weights, by job type (equal after a sync)."""
        ids = {t: j for t, j in self.job_ids.items() if j is not None}
        answer = self.transport.call("weight_norm", {"job_ids": list(ids.values())})
        return {t: float(answer["norms"][str(j)]["norm"]) for t, j in ids.items()}

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes on the sampling and log-prob jobs."""
        for job_type in ("sampling", "log_prob"):
            job_id = self.job_ids.get(job_type)
            if job_id is not None:
                self.transport.call("reset_prefix_cache", {"job_id": job_id})

    sleep_inference = _memory_call(
        "sleep_inference",
        "sampling",
        "Release the sampling job's device memory (a reported no-op where unsupported).",
    )
    wake_inference = _memory_call(
        "wake_inference", "sampling", "Reclaim the sampling job's device memory."
    )
    sleep_training = _memory_call("sleep_training", "training", "Offload the training job's state.")
    wake_training = _memory_call(
        "wake_training", "training", "Bring the training job's state back."
    )
    sleep_log_prob = _memory_call(
        "sleep_log_prob", "log_prob", "Release the log-prob job's device memory."
    )
    wake_log_prob = _memory_call(
        "wake_log_prob", "log_prob", "Reclaim the log-prob job's device memory."
    )

    # --- faults -------------------------------------------------------------------------

    def job_info(self, job_type: str) -> dict[str, Any]:
        """The server's view of this client's ``job_type`` job (state, reason, global_step, ...)."""
        return dict(self.transport.call("get_job", {"job_id": self._job(job_type)}))

    def restart_job(self, job_type: str, *, sync_weights: bool = True) -> dict[str, Any]:
        """Start a failed job again with the same id and wait until it runs.

        Training comes back from its latest checkpoint, and the server syncs its restored
        weights into the jobs it last synced into; this waits for that too. A sampling or
        log-prob job then gets the training job's current weights (``sync_weights``) when
        this client has a running training job. Returns the job's view.
        """
        job_id = self._job(job_type)
        self.transport.call("restart_job", {"job_id": job_id})
        self._wait_running(job_type, job_id)
        if job_type == "training":
            self._wait_resynced(job_id)
        trainer = self.job_ids.get("training")
        if sync_weights and job_type != "training" and trainer is not None:
            if self.transport.call("get_job", {"job_id": trainer})["state"] == "running":
                self.transport.call(
                    "sync_weights",
                    {"training_job_id": trainer, f"{job_type}_job_ids": [job_id]},
                )
        return self.job_info(job_type)

    def _wait_resynced(self, job_id: int) -> None:
        """Wait until restarted training job ``job_id`` has no pending resync (the server
        sends its restored weights to the jobs it last synced into)."""
        deadline = time.monotonic() + self.config.job_ready_timeout
        while self.transport.call("get_job", {"job_id": job_id}).get("resync_pending"):
            if time.monotonic() > deadline:
                raise JobError(
                    f"training job {job_id} still had a resync pending after "
                    f"job_ready_timeout={self.config.job_ready_timeout}s"
                )
            time.sleep(min(1.0, self.config.health_check_interval))

    # --- state and teardown -------------------------------------------------------------

    def get_server_state(self) -> dict[str, Any]:
        """The server's ``/status``: every job and the cluster."""
        return dict(self.transport.call("status"))

    def reconnect_config(self) -> ArcticRLClientConfig:
        """A config another process can use to attach to these jobs."""
        return self.config.for_reconnect(
            training_job_id=self.job_ids["training"],
            sampling_job_id=self.job_ids["sampling"],
            log_prob_job_id=self.job_ids["log_prob"],
            host=self.config.host,
            port=self.config.port,
        )

    def close(self) -> None:
        """Disconnect and leave the jobs and the server running."""
        if not self._closed:
            self._closed = True
            self.transport.close()

    def shutdown(self) -> None:
        """Stop the jobs, the server and the Ray cluster that the backend started."""
        if self._closed:
            return
        try:
            self._destroy_jobs()
        finally:
            self._closed = True
            try:
                self.backend.stop()
            finally:
                self.transport.close()

    def __enter__(self) -> ArcticRLClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owns_jobs:
            self.shutdown()
        else:
            self.close()


def _to_thread(method: Callable[..., T]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(self: AsyncArcticRLClient, *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(method, self._client, *args, **kwargs)

    return wrapper


class AsyncArcticRLClient:
    """``ArcticRLClient``'s methods as coroutines; build one with ``await create(config)``."""

    def __init__(self, client: ArcticRLClient) -> None:
        self._client = client

    @classmethod
    async def create(
        cls, config: ArcticRLClientConfig | dict[str, Any], **kwargs: Any
    ) -> AsyncArcticRLClient:
        """Start (or reconnect) the client without blocking the event loop; a client that its
        thread finishes after the caller was cancelled (Ctrl-C) is ended as ``with`` would."""
        lock, state = threading.Lock(), dict[str, Any](abandoned=False, built=None)

        def build() -> ArcticRLClient:
            client = ArcticRLClient(config, **kwargs)
            with lock:
                state["built"], abandoned = client, state["abandoned"]
            if abandoned:
                client.__exit__(None, None, None)
            return client

        try:
            return cls(await asyncio.to_thread(build))
        except asyncio.CancelledError:
            with lock:
                state["abandoned"], done = True, state["built"]
            if isinstance(done, ArcticRLClient):  # built before the cancellation reached us
                done.__exit__(None, None, None)
            raise

    @property
    def job_ids(self) -> dict[str, int | None]:
        return self._client.job_ids

    def reconnect_config(self) -> ArcticRLClientConfig:
        """A config another process can use to attach to these jobs."""
        return self._client.reconnect_config()

    generate = _to_thread(ArcticRLClient.generate)
    log_probs = _to_thread(ArcticRLClient.log_probs)
    fwd_bwd = _to_thread(ArcticRLClient.fwd_bwd)
    fwd_no_grad = _to_thread(ArcticRLClient.fwd_no_grad)
    step = _to_thread(ArcticRLClient.step)
    sync_weights = _to_thread(ArcticRLClient.sync_weights)
    save_checkpoint = _to_thread(ArcticRLClient.save_checkpoint)
    load_checkpoint = _to_thread(ArcticRLClient.load_checkpoint)
    empty_training_cache = _to_thread(ArcticRLClient.empty_training_cache)
    add_adapter = _to_thread(ArcticRLClient.add_adapter)
    remove_adapter = _to_thread(ArcticRLClient.remove_adapter)
    weight_norm = _to_thread(ArcticRLClient.weight_norm)
    reset_prefix_cache = _to_thread(ArcticRLClient.reset_prefix_cache)
    sleep_inference = _to_thread(ArcticRLClient.sleep_inference)
    wake_inference = _to_thread(ArcticRLClient.wake_inference)
    sleep_training = _to_thread(ArcticRLClient.sleep_training)
    wake_training = _to_thread(ArcticRLClient.wake_training)
    sleep_log_prob = _to_thread(ArcticRLClient.sleep_log_prob)
    wake_log_prob = _to_thread(ArcticRLClient.wake_log_prob)
    job_info = _to_thread(ArcticRLClient.job_info)
    restart_job = _to_thread(ArcticRLClient.restart_job)
    get_server_state = _to_thread(ArcticRLClient.get_server_state)
    open_session = _to_thread(ArcticRLClient.open_session)
    session_trajectory = _to_thread(ArcticRLClient.session_trajectory)
    list_sessions = _to_thread(ArcticRLClient.list_sessions)
    close_session = _to_thread(ArcticRLClient.close_session)
    close = _to_thread(ArcticRLClient.close)
    shutdown = _to_thread(ArcticRLClient.shutdown)

    async def __aenter__(self) -> AsyncArcticRLClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self._client.__exit__, *exc)
