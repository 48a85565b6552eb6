"""What the vLLM sampling and log-prob engines share: environment, engine arguments, the engine.

``VLLMEngine`` owns one ``vllm.LLM``: it builds it from ``ArcticRLClientConfig.vllm_config``
merged over defaults that suit the device, loads weights in place through the worker
extension in ``vllm_worker_extension``, reports the weight norm, sleeps and closes. vLLM and
torch are imported only when an engine is built.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    DEFAULT_ADAPTER,
    Engine,
    EngineContext,
    EngineError,
    InvalidRequestError,
    MissingDependencyError,
)
from arctic_rl_engines import vllm_metrics
from arctic_rl_engines.vllm_lora import LoraServing, lora_engine_kwargs, lora_of, named_tensor
from arctic_rl_engines.vllm_quiet_logs import quiet_per_sync_logs

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from arctic_platform.rl.api import ArcticRLClientConfig

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "arctic_rl_engines.vllm_worker_extension.ArcticWorkerExtension"
CPU_KV_CACHE_BYTES = 1 << 30  # default KV cache on CPU when neither config nor env sets one
CPU_MAX_MODEL_LEN = 4096  # cap on the context length taken from the model config on CPU
MP_BUCKET_BYTES = 256 << 20  # weights per RPC when the worker runs in another process
RESERVED_KEYS = ("model", "worker_extension_cls")
_LAYER_KEY = re.compile(r"^(.*?\.\d+)\.")

ARCTIC_INFERENCE_KEYS = (
    "use_fca",
    "zorro_inference",
    "spec_model",
    "speculative_decoding",
    "num_speculative_tokens",
    "fca_configs",
)
ARCTIC_INFERENCE_INSTALL = "pip install 'arctic-inference[vllm]'"


_OPEN_IN_PROCESS: set[int] = set()
"""ids of the open in-process engines of this process (they share vLLM's distributed state)."""


@contextmanager
def _distributed_state_kept() -> Iterator[None]:
    """While open, vLLM's engine-core shutdown frees memory but leaves the process-wide
    distributed groups alone (another in-process engine still uses them)."""
    import vllm.v1.engine.core as core_module

    original = core_module.cleanup_dist_env_and_memory
    core_module.cleanup_dist_env_and_memory = lambda *args, **kwargs: gc.collect()
    try:
        yield
    finally:
        core_module.cleanup_dist_env_and_memory = original


def cuda_available() -> bool:
    """True when torch sees a CUDA device (then vLLM's GPU defaults apply)."""
    import torch

    return bool(torch.cuda.is_available())


def prepare_environment(config: ArcticRLClientConfig, *, cuda: bool) -> dict[str, str]:
    """Set vLLM's environment before it is imported; returns the variables this call set.

    Values already in the environment win: usage stats off, ``VLLM_CACHE_ROOT`` under the
    Arctic RL cache, ``HF_HUB_OFFLINE=1`` for a local model path, and on CPU the in-process
    engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: starts in seconds, no spawned processes).
    """
    from arctic_platform.rl.api import arctic_home

    wanted = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(arctic_home() / "vllm"),
    }
    if Path(config.model_name).expanduser().exists():
        wanted["HF_HUB_OFFLINE"] = "1"
    if not cuda:
        wanted["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if arctic_inference_requested(config.arctic_inference_config):
        wanted["ARCTIC_INFERENCE_ENABLED"] = "1"
    applied = {}
    for key, value in wanted.items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    return applied


def _arctic_options(arctic: dict[str, Any] | None) -> tuple[bool, str, int, dict[str, Any]]:
    """(use_fca, spec_model, num_speculative_tokens, fca_configs) from arctic_inference_config."""
    if not arctic:
        return False, "", 3, {}
    if not isinstance(arctic, dict):
        raise InvalidRequestError(
            f"arctic_inference_config must be a dict, got {type(arctic).__name__}"
        )
    unknown = sorted(set(arctic) - set(ARCTIC_INFERENCE_KEYS))
    if unknown:
        raise InvalidRequestError(
            f"arctic_inference_config has unknown key(s) {unknown}; accepted: "
            f"{list(ARCTIC_INFERENCE_KEYS)} (engine arguments go in vllm_config)"
        )
    zorro = arctic.get("zorro_inference") or {}
    spec = arctic.get("speculative_decoding") or {}
    if not isinstance(zorro, dict) or not isinstance(spec, dict):
        raise InvalidRequestError(
            "arctic_inference_config: zorro_inference and speculative_decoding must be dicts "
            "(e.g. {'zorro_inference': {'enable': True}, 'speculative_decoding': "
            "{'model': '<path>'}})"
        )
    use_fca = bool(arctic.get("use_fca", False)) or bool(zorro.get("enable", False))
    spec_model = str(arctic.get("spec_model") or spec.get("model") or "").strip()
    num_tokens = arctic.get("num_speculative_tokens", spec.get("num_speculative_tokens", 3))
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise InvalidRequestError(
            f"arctic_inference_config num_speculative_tokens must be an integer >= 1, "
            f"got {num_tokens!r}"
        )
    fca_configs = arctic.get("fca_configs") or {}
    if not isinstance(fca_configs, dict):
        raise InvalidRequestError(
            f"arctic_inference_config fca_configs must be a dict, got {fca_configs!r}"
        )
    return use_fca, spec_model, num_tokens, fca_configs


def arctic_inference_requested(arctic: dict[str, Any] | None) -> bool:
    """True when ``arctic_inference_config`` turns on an ArcticInference feature."""
    use_fca, spec_model, _, _ = _arctic_options(arctic)
    return use_fca or bool(spec_model)


def arctic_inference_kwargs(arctic: dict[str, Any] | None) -> dict[str, Any]:
    """Engine arguments for the ArcticInference features asked for (FCA, Arctic speculator).

    ``use_fca`` (or ``zorro_inference.enable``) turns on forest cascade attention with
    piecewise CUDA graphs; ``spec_model`` (or ``speculative_decoding.model``) the Arctic
    speculator. Raises ``MissingDependencyError`` when ``arctic_inference`` is not installed.
    """
    use_fca, spec_model, num_tokens, fca_configs = _arctic_options(arctic)
    if not (use_fca or spec_model):
        return {}
    if importlib.util.find_spec("arctic_inference") is None:
        wanted = [w for w, on in (("use_fca", use_fca), ("spec_model", spec_model)) if on]
        raise MissingDependencyError(
            f"arctic_inference_config asks for {wanted}, which needs the 'arctic_inference' "
            f"package (ArcticInference, a vLLM plugin); it is not installed. Install it with "
            f"{ARCTIC_INFERENCE_INSTALL}, or drop those keys."
        )
    kwargs: dict[str, Any] = {}
    if use_fca:
        kwargs["forest_cascade_attn_configs"] = json.dumps(fca_configs)
        kwargs["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    if spec_model:
        kwargs["speculative_config"] = {
            "method": "arctic",
            "model": spec_model,
            "num_speculative_tokens": num_tokens,
        }
    return kwargs


def model_max_positions(model_name: str, trust_remote_code: bool = False) -> int | None:
    """The context length the model's Hugging Face config declares, or None if unknown."""
    try:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code)
    except Exception as exc:  # an unreadable config leaves the choice to vLLM
        logger.debug("could not read the model config of %s: %s", model_name, exc)
        return None
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def engine_kwargs(
    config: ArcticRLClientConfig, *, cuda: bool, max_positions: int | None = None
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments: device defaults, then ArcticInference, then vllm_config.

    CPU defaults: eager mode, float32, a 1 GiB KV cache (unless ``VLLM_CPU_KVCACHE_SPACE``
    is set) and ``max_model_len`` = the model's context capped at 4096. GPU defaults:
    sleep mode on. Everywhere: ``seed`` from the config and the Arctic worker extension;
    in LoRA mode (``training_config.lora``) vLLM's LoRA arguments (``vllm_lora``).
    """
    overrides = dict(config.vllm_config or {})
    for key in RESERVED_KEYS:
        if key not in overrides:
            continue
        value = overrides.pop(key)
        if key == "model" and value == config.model_name:
            continue
        if key == "worker_extension_cls" and value == WORKER_EXTENSION:
            continue
        raise InvalidRequestError(
            f"vllm_config[{key!r}]={value!r} cannot be set: the engine needs "
            + ("model_name for the model" if key == "model" else f"{WORKER_EXTENSION!r}")
        )
    kwargs: dict[str, Any] = {
        "model": config.model_name,
        "seed": config.seed,
        "worker_extension_cls": WORKER_EXTENSION,
        "disable_log_stats": True,
        **lora_engine_kwargs(lora_of(config)),
    }
    if cuda:
        kwargs["enable_sleep_mode"] = True
    else:
        kwargs["enforce_eager"] = True
        kwargs["dtype"] = "float32"
        memory_keys = ("kv_cache_memory_bytes", "gpu_memory_utilization")
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ and not any(
            k in overrides for k in memory_keys
        ):
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if max_positions is not None:
            kwargs["max_model_len"] = min(max_positions, CPU_MAX_MODEL_LEN)
    for key, value in arctic_inference_kwargs(config.arctic_inference_config).items():
        if isinstance(value, dict) and isinstance(overrides.get(key), dict):
            overrides[key] = {**value, **overrides[key]}
        else:
            kwargs[key] = value
    kwargs.update(overrides)
    return kwargs


def _group_key(name: str) -> str:
    """Tensors with the same key belong to one block (``model.layers.3``) and travel together."""
    match = _LAYER_KEY.match(name)
    return match.group(1) if match else name


def weight_buckets(
    weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    bucket_bytes: int | None,
) -> list[dict[str, torch.Tensor]]:
    """Split ``(name, tensor)`` pairs (or a mapping) into buckets of whole blocks, each up to
    ``bucket_bytes``.

    A block (all tensors of one layer) is never split, so q/k/v and gate/up, which vLLM fuses,
    always reach the worker in the same reload. ``bucket_bytes=None`` gives one bucket.
    """

    if isinstance(weights, Mapping):
        weights = weights.items()
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for item in weights:
        name, tensor = named_tensor(item, "load_weights")
        group = groups.setdefault(_group_key(name), {})
        if name in group:
            raise InvalidRequestError(f"load_weights got {name!r} twice")
        group[name] = tensor
    if not groups:
        raise InvalidRequestError("load_weights got no tensors")
    buckets: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for group in groups.values():
        group_bytes = sum(t.numel() * t.element_size() for t in group.values())
        if bucket_bytes is not None and buckets[-1] and size + group_bytes > bucket_bytes:
            buckets.append({})
            size = 0
        buckets[-1].update(group)
        size += group_bytes
    return buckets


class VLLMEngine(LoraServing, Engine):
    """One in-place-updatable ``vllm.LLM``; the sampling and log-prob engines build on it.

    Built as ``factory(config, context)``. On CPU the engine runs inside this process unless
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` is set; weights then reach the worker as tensors,
    otherwise as safetensors bytes in buckets of whole layers. In LoRA mode it serves adapter
    versions on the frozen base (``vllm_lora.LoraServing``) and full weights are refused.
    """

    def __init__(self, config: ArcticRLClientConfig, context: EngineContext | None = None) -> None:
        self.config = config
        self.context = context or EngineContext(role="sampling")
        self.lora = lora_of(config)
        self._cuda = cuda_available()
        prepare_environment(config, cuda=self._cuda)
        overrides = config.vllm_config or {}
        max_positions = None
        if not self._cuda and "max_model_len" not in overrides:
            max_positions = model_max_positions(
                config.model_name, bool(overrides.get("trust_remote_code", False))
            )
        self.engine_kwargs = engine_kwargs(config, cuda=self._cuda, max_positions=max_positions)
        self.engine_kwargs.update(vllm_metrics.stats_kwargs(dict(config.vllm_config or {})))
        quiet_per_sync_logs()
        started = time.monotonic()
        import torch
        from vllm import LLM

        if self.lora is not None:  # adapters with lm_head among their targets (any model)
            from arctic_rl_engines.vllm_output_lora import install

            install()

        set_num_threads = torch.set_num_threads
        self._llm: Any = None
        try:
            self._llm = LLM(**self.engine_kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(
                f"vLLM refused the engine arguments for {config.model_name!r} ({exc}); "
                f"they were {self.engine_kwargs} (defaults merged with vllm_config)"
            ) from exc
        except Exception as exc:
            raise EngineError(f"vLLM could not start {config.model_name!r}: {exc}") from exc
        self.start_seconds = time.monotonic() - started
        self.exports_metrics = vllm_metrics.attach(self._llm)
        model_config = self._llm.llm_engine.model_config
        self.max_model_len: int = int(model_config.max_model_len)
        self.vocab_size: int = int(model_config.get_vocab_size())
        self.max_logprobs: int = int(model_config.max_logprobs)
        self.in_process: bool = type(self._llm.llm_engine.engine_core).__name__ == "InprocClient"
        if self.in_process:
            _OPEN_IN_PROCESS.add(id(self))
        if self.in_process and not self._cuda:
            # vLLM's CPU worker disables torch.set_num_threads process-wide, for the thread
            # binding of its worker processes; an in-process engine binds nothing, so the host
            # process (a trainer, a test) keeps control of its thread count.
            torch.set_num_threads = set_num_threads
        self.sleep_supported: bool = bool(
            self._cuda and self.engine_kwargs.get("enable_sleep_mode")
        )
        self.last_load: dict[str, Any] = {}
        self._asleep: int = 0  # sleep level, 0 when awake
        self._weights_discarded = False
        self._lora_start(self.context.work_dir)
        logger.info(
            "vLLM engine for %s started in %.1f s (%s, max_model_len=%d)",
            config.model_name,
            self.start_seconds,
            "in-process" if self.in_process else "multi-process",
            self.max_model_len,
        )

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM``; raises ``EngineError`` once the engine is closed."""
        if self._llm is None:
            raise EngineError("the vLLM engine is closed")
        return self._llm

    def _ready(self) -> Any:
        """The ``vllm.LLM`` when it may serve requests (awake, weights present)."""
        llm = self.llm
        if self._asleep:
            raise EngineError(f"the vLLM engine is asleep (level {self._asleep}); call wake()")
        if self._weights_discarded:
            raise EngineError(
                "the vLLM engine's weights were discarded by sleep(level=2); load_weights first"
            )
        return llm

    @property
    def tokenizer(self) -> Any:
        """The tokenizer vLLM serves the model with."""
        return self.llm.get_tokenizer()

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None:
        """Replace the served weights in place (checkpoint names), then reset the prefix cache.

        Tensors go to the worker without a copy when it shares this process and
        ``bucket_bytes`` is None; otherwise as safetensors bytes, ``bucket_bytes`` (default
        256 MiB) of whole layers per call. LoRA mode: the default adapter's next version.
        """
        if self.adapter_store is not None:
            self.load_adapter(DEFAULT_ADAPTER, self._next_version(), weights)
            return
        self._load_weights(weights, bucket_bytes)

    def _next_version(self) -> int:
        """The default adapter's next version (1 for the first)."""
        latest = self._store("an adapter sync").latest(DEFAULT_ADAPTER)
        return 1 if latest is None else latest + 1

    def _load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int | None = None,
        *,
        reset_running: bool = False,
    ) -> None:
        """``load_weights`` in the calling thread; ``reset_running`` also recomputes the KV
        cache of running requests (see ``_reset_prefix_cache``)."""
        from safetensors.torch import save

        llm = self.llm
        if self._asleep:
            raise EngineError(f"the vLLM engine is asleep (level {self._asleep}); call wake()")
        started = time.monotonic()
        as_bytes = bucket_bytes is not None or not self.in_process
        limit = (bucket_bytes or MP_BUCKET_BYTES) if as_bytes else None
        buckets = weight_buckets(weights, limit)
        names = [name for bucket in buckets for name in bucket]
        if self.adapter_store is not None:
            raise InvalidRequestError(
                "a full-weight load into a LoRA job is refused (its base model is frozen; "
                "sync the trainer's adapter); nothing loaded"
            )
        self._refuse_adapter_tensors(names)
        shapes = [(n, list(t.shape)) for bucket in buckets for n, t in bucket.items()]
        problems = llm.collective_rpc("arctic_check_weights", args=(shapes,))[0]
        if problems:
            raise InvalidRequestError("load_weights: " + "; ".join(problems) + "; nothing loaded")
        total = 0
        for index, bucket in enumerate(buckets):
            tensors = {n: t.detach() for n, t in bucket.items()}
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            payload: Any = tensors
            if as_bytes:
                payload = save({n: t.cpu().contiguous() for n, t in tensors.items()})
            try:
                llm.collective_rpc("arctic_load_weights", args=(payload, len(buckets) > 1))
            except Exception as exc:
                raise EngineError(
                    f"load_weights failed in bucket {index + 1}/{len(buckets)} ({exc}); the "
                    "served weights may now be a mix of old and new: load a full set again"
                ) from exc
        self._weights_discarded = False
        self._reset_prefix_cache(running=reset_running)
        self.last_load = {
            "tensors": len(names),
            "bytes": total,
            "buckets": len(buckets),
            "seconds": time.monotonic() - started,
        }

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (computed under the old weights)."""
        self._reset_prefix_cache()

    def _reset_prefix_cache(self, *, running: bool = False) -> None:
        """Drop every cached prefix. vLLM refuses while running requests hold KV blocks;
        ``running=True`` first preempts them (their KV is recomputed when they resume)."""
        llm = self.llm
        if not llm.reset_prefix_cache(reset_running_requests=running):
            raise EngineError("vLLM did not reset its prefix cache (requests still running?)")

    def weight_norm(self) -> float:
        """L2 norm (float64) over the checkpoint-format weights the engine serves; in LoRA
        mode the base's plus the default adapter's latest version (as a LoRA trainer counts)."""
        sums = self.llm.collective_rpc("arctic_weight_sumsq")
        entry = None if self.adapter_store is None else self.adapter_store.resolve(None, None)
        return math.sqrt(float(sums[0]) + (entry.sumsq if entry is not None else 0.0))

    def served_weight_norm(self) -> dict[str, Any]:
        """L2 norm (float64) of the weights vLLM computes with, read back from the model.

        A check of ``weight_norm`` (which is kept from the checkpoint-format tensors loaded):
        fused and kernel-packed weights included; exact at tensor-parallel size 1 only. In
        LoRA mode the base is read back and the default adapter's latest version added.
        """
        llm = self.llm
        tp = int(llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size)
        if tp != 1:
            raise InvalidRequestError(
                f"served_weight_norm reads one worker's tensors; tensor_parallel_size is {tp}"
            )
        report = llm.collective_rpc("arctic_served_sumsq")[0]
        entry = None if self.adapter_store is None else self.adapter_store.resolve(None, None)
        sumsq = float(report["sumsq"]) + (entry.sumsq if entry is not None else 0.0)
        out = {"norm": math.sqrt(sumsq), "read_back": report["read_back"]}
        if entry is not None:
            out["adapter"] = entry.request.lora_name
        return out

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """Free device memory (level 1: offload weights, drop KV cache; 2: drop both)."""
        if isinstance(level, bool) or level not in (1, 2):
            raise InvalidRequestError(f"sleep level must be 1 or 2, got {level!r}")
        if level == 2 and self.adapter_store is not None:
            raise InvalidRequestError(
                "sleep(level=2) discards the base weights, which a LoRA job cannot load again "
                "(full-weight loads are refused there); use level 1"
            )
        llm = self.llm
        if not self.sleep_supported:
            return {"supported": False, "reason": self._no_sleep_reason(), "level": level}
        if self._asleep:
            return {"supported": True, "level": self._asleep, "already_asleep": True}
        llm.sleep(level=level)
        self._asleep = level
        return {"supported": True, "level": level}

    def wake(self) -> dict[str, Any]:
        """Undo ``sleep``; after level 2 the weights must be loaded again before serving."""
        llm = self.llm
        if not self.sleep_supported:
            return {"supported": False, "reason": self._no_sleep_reason()}
        if not self._asleep:
            return {"supported": True, "already_awake": True}
        level, self._asleep = self._asleep, 0
        llm.wake_up()
        llm.reset_prefix_cache()
        self._weights_discarded = level == 2
        return {"supported": True, "level": level, "weights_discarded": level == 2}

    def _no_sleep_reason(self) -> str:
        if not self._cuda:
            return (
                "vLLM's CPU backend has no sleep mode (its worker ignores sleep/wake_up): "
                "weights and KV cache stay in memory"
            )
        return "the engine was started with enable_sleep_mode=False (vllm_config)"

    def close(self) -> None:
        """Shut the engine down and free its memory (weights, KV cache, processes)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        _OPEN_IN_PROCESS.discard(id(self))
        self._lora_close()
        # vLLM's shutdown tears down the process-wide distributed groups: only the last
        # in-process engine may do that, or closing one engine breaks the others.
        keep = self.in_process and bool(_OPEN_IN_PROCESS)
        try:
            with _distributed_state_kept() if keep else nullcontext():
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if self._cuda:
                import torch

                torch.cuda.empty_cache()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_token_ids(value: Any, what: str, vocab_size: int) -> list[int]:
    """``value`` as a list of token ids, each in ``[0, vocab_size)``; else InvalidRequestError."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise InvalidRequestError(f"{what} must be a list of token ids, got {type(value).__name__}")
    ids = list(value)
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequestError(f"{what} holds {token!r}, which is not a token id (int)")
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"{what} holds token id {token}, outside the vocabulary [0, {vocab_size})"
            )
    return ids
