"""Tinker's sessions, models and samplers mapped onto ``RLServer`` operations.

A model is a named LoRA adapter in its pool (one training and one sampling job per base model
and LoRA shape, shared by that pool's models: ``pools.py``); with the server's explicit
``full_fine_tuning`` it is a training job plus a sampling job of its own.
``save_weights_for_sampler`` is a ``sync_weights`` whose (adapter) version the returned
``tinker://`` path names; a sampler on an older path keeps that adapter version. This object
holds only the Tinker-side names (ids, paths, versions); every job state lives in the server.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from arctic_platform.rl.api import ArcticRLError, InvalidRequestError, JobError, RLServer
from arctic_rl_tinker import convert, lora_models
from arctic_rl_tinker.futures import (
    Coalescer,
    Future,
    Futures,
    Lane,
    Outcome,
    failure,
    run_into,
)
from arctic_rl_tinker.gpu_seats import GpuSeats, Seat, server_gpus
from arctic_rl_tinker.losses import PREFIX, TINKER_LOSSES
from arctic_rl_tinker.pools import (
    Pool,
    Pools,
    adapter_name,
    describe_shape,
    pool_key,
    start_pool,
)
from arctic_rl_tinker.records import (
    SESSION_TTL,
    Gpus,
    Model,
    Sampler,
    SessionGoneError,
    StaleWeightsError,
    UnknownIdError,
)
from arctic_rl_tinker.sampling import SamplingMixin

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

SAMPLE_QUIET = 0.003
"""Seconds a sampler's open batch waits for one more asample before it goes to ``generate``."""
SAMPLE_WINDOW = 0.025
"""The most seconds an asample waits for others of its sampler (the SDK sends a group's
prompts as separate requests, which arrive a few ms apart)."""
MAX_SAMPLE_BATCH = 256
"""Most prompts in one shared ``generate``."""


class TinkerFrontend(SamplingMixin):
    """Tinker's API over one ``RLServer``: ids, paths and ordering; the work is the server's."""

    def __init__(
        self,
        server: RLServer,
        *,
        gpus: Gpus | None = None,
        job_ready_timeout: float = 900.0,
        session_ttl: float = SESSION_TTL,
        full_fine_tuning: bool = False,
        pool_gpus: int = 1,
    ) -> None:
        self.server = server
        self.full_fine_tuning = full_fine_tuning
        total = server_gpus(server)
        self.gpus = gpus or Gpus.from_total(total)  # a full-fine-tuning model's jobs
        self.seats = GpuSeats(total, pool_gpus)  # LoRA pools and base samplers
        self.job_ready_timeout = job_ready_timeout
        self.futures = Futures()
        self._lock = threading.Lock()
        self.sessions: dict[str, float] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, Sampler] = {}
        self.paths: dict[str, tuple[str, str, Any]] = {}  # tinker path -> (kind, model, what)
        self._base_samplers: dict[str, int] = {}  # base model -> its own sampling job
        self.pools = Pools()
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="tinker-work")
        self._samples = Coalescer(
            self._dispatch_samples,
            self._pool.submit,
            quiet=SAMPLE_QUIET,
            window=SAMPLE_WINDOW,
            max_items=MAX_SAMPLE_BATCH,
        )
        self._finished: set[str] = set()
        self.session_ttl = session_ttl
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._expire, name="tinker-sessions", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Stop the lanes and the worker pool (the jobs belong to the server)."""
        self._stop.set()
        for model in list(self.models.values()):
            model.lane.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _expire(self) -> None:
        """Finish sessions whose client stopped beating, so their jobs free their GPUs."""
        while not self._stop.wait(min(15.0, self.session_ttl / 4)):
            now = time.time()
            with self._lock:
                stale = [s for s, seen in self.sessions.items() if now - seen > self.session_ttl]
            for session_id in stale:
                logger.info(
                    "tinker session %s sent no heartbeat for %.0f s: finishing it",
                    session_id,
                    self.session_ttl,
                )
                self.finish_session(session_id)

    def finish_session(self, session_id: str) -> None:
        """End a session: its models' adapters leave their pools (a pool's jobs go with its
        last model; a full-fine-tuning model's jobs go with it), their samplers and paths are
        forgotten (a base sampler on a job that goes moves to another pool of its base)."""
        with self._lock:
            self.sessions.pop(session_id, None)
            self._finished.add(session_id)
            models = [m for m in self.models.values() if m.session_id == session_id]
            for model in models:
                del self.models[model.model_id]
            gone = {m.model_id for m in models}
            jobs = {j for m in models if m.pool is None for j in (m.training_job, m.sampling_job)}
            for model in models:
                if model.pool is not None and self.pools.leave(model.pool, model.model_id):
                    jobs.update(model.pool.jobs())
                    self.seats.release(model.pool.owner)
            jobs.discard(None)
            pooled = {(m.sampling_job, m.adapter) for m in models if m.pool is not None}
            for sampler_id, sampler in list(self.samplers.items()):
                if (sampler.job_id, sampler.adapter) in pooled:
                    del self.samplers[sampler_id]
                elif sampler.job_id in jobs:
                    other = self.pools.sampling_job(sampler.base_model)
                    if sampler.adapter == lora_models.BASE_ADAPTER and other is not None:
                        sampler.job_id = other
                    else:
                        del self.samplers[sampler_id]
            for path in [k for k, v in self.paths.items() if v[1] in gone]:
                del self.paths[path]
        for model in models:
            model.lane.close()
            if model.pool is not None and model.training_job not in jobs:
                self._drop_adapter(model)
        for job_id in sorted(j for j in jobs if j is not None):
            try:
                self.server.handle("destroy", {"job_id": job_id})
            except ArcticRLError as exc:
                logger.warning("tinker session %s: destroying job %s: %s", session_id, job_id, exc)

    def _drop_adapter(self, model: Model) -> None:
        """Remove a finished model's adapter from its pool's jobs (the pool goes on)."""
        for job_id in (model.training_job, model.sampling_job):
            if job_id is None:
                continue
            try:
                self.server.handle("remove_adapter", {"job_id": job_id, "adapter": model.adapter})
            except ArcticRLError as exc:  # never synced, or the job is gone: nothing held
                logger.debug("model %s: remove_adapter on job %s: %s", model.model_id, job_id, exc)

    # --- lookups ----------------------------------------------------------------------

    def session(self, session_id: str) -> None:
        """Check that ``session_id`` is live (SessionGoneError, UnknownIdError otherwise)."""
        if session_id in self.sessions:
            return
        if session_id in self._finished:
            raise SessionGoneError(f"session {session_id!r} has finished")
        raise UnknownIdError(f"unknown session_id {session_id!r}")

    def _known(self, table: dict[str, _T], key: str, what: str) -> _T:
        with self._lock:
            found = table.get(key)
        if found is None:
            raise UnknownIdError(f"unknown {what} {key!r}")
        return found

    def model(self, model_id: str) -> Model:
        """The model ``model_id`` (UnknownIdError otherwise)."""
        return self._known(self.models, model_id, "model_id")

    def sampler(self, sampler_id: str) -> Sampler:
        """The sampling session ``sampler_id`` (UnknownIdError otherwise)."""
        return self._known(self.samplers, sampler_id, "sampling_session_id")

    def _ready(self, model: Model) -> Model:
        if not model.ready.wait(self.job_ready_timeout):
            raise JobError(f"model {model.model_id} was not ready after {self.job_ready_timeout}s")
        if model.error is not None:
            raise JobError(f"model {model.model_id} could not be created: {model.error}")
        return model

    # --- sessions ---------------------------------------------------------------------

    def create_session(self) -> str:
        """A new session id."""
        session_id = str(uuid.uuid4())
        with self._lock:
            self.sessions[session_id] = time.time()
        return session_id

    def heartbeat(self, session_id: str) -> None:
        """Note that the session's client is alive."""
        self.session(session_id)
        with self._lock:
            self.sessions[session_id] = time.time()

    # --- models -----------------------------------------------------------------------

    def _job_config(
        self, base_model: str, lora: dict[str, Any] | None = None, gpus: Gpus | None = None
    ) -> dict[str, Any]:
        from arctic_platform.rl.api import ArcticRLClientConfig

        gpus = gpus or self.gpus
        config = ArcticRLClientConfig(
            model_name=base_model,
            training_config={"lora": lora} if lora is not None else None,
            host="127.0.0.1",
            port=1,
            training_gpus=gpus.training,
            sampling_gpus=gpus.sampling,
            colocate=gpus.colocate,
        )
        return config.initialize_payload()

    def _start_job(self, job_type: str, config: dict[str, Any], group: str | None = None) -> int:
        request: dict[str, Any] = {"job_type": job_type, "config": config}
        if group is not None:
            request["colocation_group"] = group
        answer = self.server.handle("initialize", request)
        return int(answer["job_id"])

    def _wait_running(self, job_id: int) -> None:
        deadline = time.monotonic() + self.job_ready_timeout
        while True:
            info = self.server.handle("get_job", {"job_id": job_id})
            if info["state"] == "running":
                return
            if info["state"] in ("failed", "cancelled", "terminated"):
                raise JobError(f"job {job_id} is {info['state']}: {info.get('reason')}")
            if time.monotonic() > deadline:
                raise JobError(f"job {job_id} was still {info['state']} after the ready timeout")
            time.sleep(0.5)

    def create_model(
        self,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        lora_config: dict[str, Any] | None,
    ) -> Future:
        """Start a training and a sampling job for ``base_model`` (a LoRA adapter of Tinker's
        ``lora_config`` unless the server does full fine-tuning); the future answers its id."""
        self.session(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        lora = None if self.full_fine_tuning else lora_models.lora_section(lora_config)
        lora_models.check_base_model(base_model)
        if lora is not None:
            lora_models.check_targets(base_model, lora["target_modules"])
        rank = lora["rank"] if lora else (lora_config or {}).get("rank")
        with self._lock:
            if model_id in self.models:
                raise InvalidRequestError(f"model {model_id} already exists")
            model = Model(
                model_id, base_model, Lane(model_id), session_id, lora_rank=rank, lora=lora
            )
            if lora is not None:
                key = pool_key(base_model, lora)
                seat, owner = None, f"pool-{uuid.uuid4().hex[:12]}"
                if self.pools.live(key) is None:  # a new shape: GPUs of its own, or a 409 now
                    seat = self.seats.take_pool(owner, describe_shape(key))
                model.adapter = adapter_name(model_id)
                model.pool, new_pool = self.pools.join(key, lora, model_id, seat, owner)
            self.models[model_id] = model
        future = self.futures.new("create_model")

        def work() -> Outcome:
            try:
                if model.pool is not None:
                    self._join_pool(model, model.pool, new_pool)
                else:
                    config = self._job_config(base_model, lora)
                    model.training_job = self._start_job("training", config)
                    model.sampling_job = self._start_job("sampling", config)
                    self._wait_running(model.training_job)
                    self._wait_running(model.sampling_job)
            except BaseException as exc:
                model.error = str(exc)
                model.ready.set()
                self._forget_failed(model)
                raise
            model.ready.set()
            return Outcome(json={"model_id": model_id, "type": "create_model"})

        self._pool.submit(run_into, future, work)
        return future

    def _join_pool(self, model: Model, pool: Pool, new: bool) -> None:
        """Start the pool's jobs (a new pool) or wait for them, then add the model's adapter."""
        if new:
            seat: Seat = pool.seat
            config = self._job_config(pool.base_model, pool.lora, seat.gpus)
            try:
                start = lambda t: self._start_job(t, config, seat.group)  # noqa: E731
                start_pool(pool, start, self._wait_running)
            except BaseException:
                with self._lock:
                    self.pools.forget(pool)
                    self.seats.release(pool.owner)
                raise
        else:
            pool.wait(self.job_ready_timeout)
        model.training_job, model.sampling_job = pool.training_job, pool.sampling_job
        seed = (model.lora or {}).get("seed")
        request = {"job_id": pool.training_job, "adapter": model.adapter, "seed": seed}
        self.server.handle("add_adapter", request)

    def _forget_failed(self, model: Model) -> None:
        """Undo what a model that could not be created holds: its own jobs, or its place in
        its pool (and the pool's jobs when it was the last member)."""
        jobs = [model.training_job, model.sampling_job] if model.pool is None else []
        if model.pool is not None:
            with self._lock:
                if self.pools.leave(model.pool, model.model_id):
                    jobs = list(model.pool.jobs())
                    self.seats.release(model.pool.owner)
        for job_id in jobs:
            if job_id is not None:
                try:
                    self.server.handle("destroy", {"job_id": job_id})
                except ArcticRLError:
                    pass

    def get_info(self, model_id: str) -> dict[str, Any]:
        """Tinker's GetInfoResponse: ``is_lora`` and the rank (false and None: full weights)."""
        model = self.model(model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {
                "arch": None,
                "model_name": model.base_model,
                "tokenizer_id": model.base_model,
            },
            "optimizer_config": {"type": "adamw"},
            "is_lora": model.lora is not None,
            "lora_rank": model.lora["rank"] if model.lora else None,
            "model_name": model.base_model,
        }

    # --- ordered training requests ----------------------------------------------------

    def _ordered(self, model: Model, seq_id: int | None, kind: str, work: Any) -> Future:
        """Run ``work()`` (returning an Outcome) in ``model``'s seq_id order; its future."""
        if seq_id is not None:
            known = model.lane.known(seq_id)
            if known is not None and self.futures.get(known) is not None:
                return self.futures.get(known)  # type: ignore[return-value]
        future = self.futures.new(kind)

        def run() -> None:
            run_into(future, lambda: work(self._ready(model)))

        if seq_id is None:
            self._pool.submit(run)
        else:
            model.lane.submit(seq_id, future.request_id, run)
        return future

    def refuse(self, model_id: str, seq_id: int | None) -> None:
        """A refused request still used its seq_id: let the model's later requests run."""
        with self._lock:
            model = self.models.get(model_id)
        if model is not None and seq_id is not None:
            model.lane.skip(seq_id)

    def forward_backward(self, body: bytes) -> Future:
        """A ForwardBackwardRequest protobuf: our fwd_bwd (or forward only) with log-probs."""
        try:
            batch = convert.parse_forward_backward(body)
        except convert.TinkerInputError as exc:  # refused at parse time: free its seq_id
            if exc.model_id is not None:
                self.refuse(exc.model_id, exc.seq_id)
            raise
        try:
            model = self.model(batch.model_id)
            if batch.loss_fn not in TINKER_LOSSES:
                raise InvalidRequestError(
                    f"unknown loss_fn {batch.loss_fn!r}; this server offers {list(TINKER_LOSSES)}"
                )
            from arctic_rl_tinker.losses import make

            make(batch.loss_fn).configure(batch.loss_config)  # refuse a bad config now
            if batch.loss_fn != "cross_entropy":
                ours = {"logprobs": "old_log_probs", "advantages": "advantages"}
                missing = [name for name, field in ours.items() if field not in batch.batch]
                if missing:
                    raise InvalidRequestError(
                        f"loss_fn {batch.loss_fn!r} needs loss_fn_inputs {sorted(missing)}"
                    )
        except ArcticRLError:
            self.refuse(batch.model_id, batch.seq_id)
            raise

        def work(model: Model) -> Outcome:
            result = self.server.handle(
                "fwd_bwd",
                {
                    "job_id": model.training_job,
                    "batch": batch.batch,
                    "loss_fn": PREFIX + batch.loss_fn,
                    "loss_config": batch.loss_config,
                    "return_log_probs": True,
                    "forward_only": batch.forward_only,
                    **model.adapter_fields(),
                },
            )
            return Outcome(proto=convert.forward_backward_output(batch, result))

        kind = "forward" if batch.forward_only else "forward_backward"
        return self._ordered(model, batch.seq_id, kind, work)

    def optim_step(self, model_id: str, seq_id: int | None, adam: dict[str, Any]) -> Future:
        """Tinker's AdamParams, all of them, as one ``step``."""
        model = self.model(model_id)
        payload = {
            "learning_rate": float(adam.get("learning_rate", 1e-4)),
            "beta1": float(adam.get("beta1", 0.9)),
            "beta2": float(adam.get("beta2", 0.95)),
            "eps": float(adam.get("eps", 1e-12)),
            "weight_decay": float(adam.get("weight_decay", 0.0)),
            "grad_clip_norm": float(adam.get("grad_clip_norm", 0.0)),
        }

        def work(model: Model) -> Outcome:
            request = {"job_id": model.training_job, **payload, **model.adapter_fields()}
            result = self.server.handle("step", request)
            metrics = {
                "learning_rate:mean": float(result.get("lr", payload["learning_rate"])),
                "grad_norm:mean": float(result.get("grad_norm", 0.0)),
                "applied:max": 1.0 if result.get("applied", True) else 0.0,
            }
            return Outcome(json={"type": "optim_step", "metrics": metrics})

        return self._ordered(model, seq_id, "optim_step", work)

    def _sync(self, model: Model) -> int:
        payload = {"training_job_id": model.training_job, "sampling_job_ids": [model.sampling_job]}
        if model.lora is not None:  # an adapter-only sync: a new version, the old ones stay
            payload["adapter"] = model.adapter
        if model.pool is not None:  # the pool's trainer sends this model's adapter
            payload["training_adapter"] = model.adapter
        return int(self.server.handle("sync_weights", payload)["weight_version"])

    def _served(self, model: Model) -> str | None:
        """The adapter a sampler of ``model`` asks for (None: full weights)."""
        return model.adapter if model.lora is not None else None

    def save_weights_for_sampler(
        self, model_id: str, seq_id: int | None, name: str | None
    ) -> Future:
        """``sync_weights`` into the model's sampler; a ``tinker://`` path of that version."""
        model = self.model(model_id)

        def work(model: Model) -> Outcome:
            version = self._sync(model)
            label = f"{name}-v{version}" if name else f"v{version}"
            path = f"tinker://{model.model_id}/sampler_weights/{label}"
            assert model.sampling_job is not None
            with self._lock:
                self.paths[path] = ("sampler", model.model_id, version)
            answer: dict[str, Any] = {"type": "save_weights_for_sampler", "path": path}
            if name is None:  # save_weights_and_get_sampling_client: a session on it
                answer["sampling_session_id"] = self._new_sampler(
                    model.base_model, model.sampling_job, version, path, self._served(model)
                )
            return Outcome(json=answer)

        return self._ordered(model, seq_id, "save_weights_for_sampler", work)

    def save_weights(self, model_id: str, seq_id: int | None, name: str | None) -> Future:
        """A full checkpoint (weights and optimizer) of the training job."""
        model = self.model(model_id)

        def work(model: Model) -> Outcome:
            tag = name
            if model.pool is not None:  # its pool's other models save into the same root
                tag = f"{model.adapter}-{name or uuid.uuid4().hex[:12]}"
            request = {"job_id": model.training_job, "tag": tag, **model.adapter_fields()}
            answer = self.server.handle("save_checkpoint", request)
            label = name or f"step{answer['global_step']}"
            path = f"tinker://{model.model_id}/weights/{label}"
            with self._lock:
                self.paths[path] = ("weights", model.model_id, answer["path"])
            return Outcome(json={"type": "save_weights", "path": path})

        return self._ordered(model, seq_id, "save_weights", work)

    def load_weights(
        self, model_id: str, seq_id: int | None, path: str, optimizer: bool = True
    ) -> Future:
        """Restore a checkpoint this model saved: weights and optimizer state, or (``optimizer``
        false) the weights with a fresh optimizer."""
        model = self.model(model_id)
        with self._lock:
            entry = self.paths.get(path)
        if entry is None or entry[0] != "weights":
            self.refuse(model_id, seq_id)
            raise UnknownIdError(f"unknown checkpoint path {path!r} (save_weights gives one)")
        if entry[1] != model_id:
            self.refuse(model_id, seq_id)
            raise InvalidRequestError(
                f"{path} was saved by model {entry[1]}; a model loads only its own checkpoints"
            )

        request: dict[str, Any] = {"path": entry[2]}
        if not optimizer:
            request["optimizer"] = False

        def work(model: Model) -> Outcome:
            job = {"job_id": model.training_job, **model.adapter_fields()}
            self.server.handle("load_checkpoint", {**job, **request})
            return Outcome(json={"type": "load_weights", "path": path, "model_id": model_id})

        return self._ordered(model, seq_id, "load_weights", work)


__all__ = [
    "Gpus",
    "Model",
    "Sampler",
    "SessionGoneError",
    "StaleWeightsError",
    "TinkerFrontend",
    "UnknownIdError",
    "failure",
]
