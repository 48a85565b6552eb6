"""The sampling half of the Tinker front-end: sampling sessions (on a saved sampler path's
adapter or weight version, or on a base model) and their ``asample`` requests, coalesced into
shared ``generate`` calls."""

from __future__ import annotations

import functools
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import InvalidRequestError, RLServer
from arctic_rl_tinker import lora_models
from arctic_rl_tinker.futures import Coalescer, Future, Futures, failure, run_into
from arctic_rl_tinker.gpu_seats import GpuSeats
from arctic_rl_tinker.pools import Pools
from arctic_rl_tinker.records import Gpus, Model, Sampler, UnknownIdError
from arctic_rl_tinker.sample_requests import SampleItem, prompt_tokens, sampling_params


class SamplingMixin:
    """``TinkerFrontend``'s sampling sessions and samples (its tables are the front-end's)."""

    server: RLServer
    futures: Futures
    samplers: dict[str, Sampler]
    paths: dict[str, tuple[str, str, Any]]
    pools: Pools
    _lock: threading.Lock
    _pool: ThreadPoolExecutor
    _samples: Coalescer
    _base_samplers: dict[str, int]
    seats: GpuSeats
    full_fine_tuning: bool

    if TYPE_CHECKING:  # the front-end's own methods

        def session(self, session_id: str) -> None: ...
        def model(self, model_id: str) -> Model: ...
        def _ready(self, model: Model) -> Model: ...
        def _served(self, model: Model) -> str | None: ...
        def _start_job(
            self, job_type: str, config: dict[str, Any], group: str | None = None
        ) -> int: ...
        def _wait_running(self, job_id: int) -> None: ...
        def _job_config(
            self, base_model: str, lora: dict[str, Any] | None = None, gpus: Gpus | None = None
        ) -> dict[str, Any]: ...

    def _new_sampler(
        self,
        base_model: str,
        job_id: int,
        version: int,
        path: str | None,
        adapter: str | None = None,
    ) -> str:
        sampler_id = f"sampler-{uuid.uuid4()}"
        sampler = Sampler(sampler_id, base_model, job_id, version, path, adapter)
        with self._lock:
            self.samplers[sampler_id] = sampler
        return sampler_id

    def _base_sampler_job(self, base_model: str) -> int:
        """A sampling job of the untrained ``base_model`` (started once, kept)."""
        with self._lock:
            job_id = self._base_samplers.get(base_model)
            seat, owner = None, f"base:{base_model}"
            if job_id is None and not self.full_fine_tuning:  # GPUs of its own, or a 409 now
                seat = self.seats.take_base(owner, f"a sampler of {base_model}")
        if job_id is None:
            try:
                gpus, group = (seat.gpus, seat.group) if seat is not None else (None, None)
                config = self._job_config(base_model, gpus=gpus)
                job_id = self._start_job("sampling", config, group)
            except BaseException:
                with self._lock:
                    self.seats.release(owner)
                raise
            with self._lock:
                self._base_samplers[base_model] = job_id
        self._wait_running(job_id)
        return job_id

    def create_sampling_session(
        self, session_id: str, model_path: str | None, base_model: str | None
    ) -> str:
        """A sampler on a ``tinker://`` sampler path's version, or on a base model."""
        self.session(session_id)
        if model_path:
            with self._lock:
                entry = self.paths.get(model_path)
            if entry is None or entry[0] != "sampler":
                raise UnknownIdError(
                    f"unknown sampler path {model_path!r} (save_weights_for_sampler gives one)"
                )
            model = self._ready(self.model(entry[1]))
            assert model.sampling_job is not None
            return self._new_sampler(
                model.base_model, model.sampling_job, entry[2], model_path, self._served(model)
            )
        if not base_model:
            raise InvalidRequestError("create_sampling_session needs model_path or base_model")
        with self._lock:
            shared = self.pools.sampling_job(base_model)
        if shared is not None:
            return self._new_sampler(base_model, shared, 0, None, lora_models.BASE_ADAPTER)
        return self._new_sampler(base_model, self._base_sampler_job(base_model), 0, None)

    def sample(self, sampler: Sampler, request: dict[str, Any]) -> Future:
        """One prompt, ``num_samples`` completions from the sampler's job and version."""
        prompt = prompt_tokens(request.get("prompt"))
        refused = [
            key
            for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")
            if request.get(key)
        ]
        if request.get("target_prompt_logprobs") is not None:
            refused.append("target_prompt_logprobs")
        if refused:
            raise InvalidRequestError(f"this server does not offer {refused}")
        want_prompt = bool(request.get("prompt_logprobs"))
        last_n = request.get("prompt_logprobs_last_n")
        params = sampling_params(request.get("sampling_params") or {})
        params["n"] = int(request.get("num_samples") or 1)
        if want_prompt:
            params["prompt_logprobs"] = True
        future = self.futures.new("sample")
        item = SampleItem(sampler, prompt, future, want_prompt, last_n)
        if params.get("seed") is not None:  # seeds go per prompt in a batch: never shared
            self._pool.submit(self._run_samples, params, [item])
        else:
            key = (
                sampler.job_id,
                sampler.adapter,
                sampler.version,
                json.dumps(params, sort_keys=True),
            )
            self._samples.add(key, (params, item))
        return future

    def _dispatch_samples(self, _: Any, batch: list[tuple[dict[str, Any], SampleItem]]) -> None:
        self._run_samples(batch[0][0], [item for _, item in batch])

    def _run_samples(self, params: dict[str, Any], items: list[SampleItem]) -> None:
        """One ``generate`` for the prompts of ``items`` (one sampling job and weight or
        adapter version, the same parameters); if it refuses them, each prompt alone, so that
        a bad prompt fails only its own request. A full-weight job serves only its newest
        weights; a LoRA job serves any adapter version it keeps."""
        sampler = items[0].sampler
        job_id, version = sampler.job_id, sampler.version
        request: dict[str, Any] = {
            "job_id": job_id,
            "prompts": [item.prompt for item in items],
            "sampling_params": params,
        }
        try:
            if sampler.adapter is None:
                info = self.server.handle("get_job", {"job_id": job_id})
                if info.get("weight_version", 0) != version:
                    for item in items:
                        item.future.set(failure(item.stale(info.get("weight_version"))))
                    return
            else:
                request["adapter"] = sampler.adapter
                if sampler.adapter != lora_models.BASE_ADAPTER:
                    request["adapter_version"] = version
            answer = self.server.handle("generate", request)
        except InvalidRequestError as exc:
            if len(items) == 1:
                items[0].future.set(failure(exc))
            else:
                for item in items:
                    self._run_samples(params, [item])
            return
        except BaseException as exc:
            for item in items:
                item.future.set(failure(exc))
            return
        for item, output in zip(items, answer["outputs"], strict=True):
            run_into(item.future, functools.partial(item.outcome, output))


__all__ = ["SamplingMixin"]
