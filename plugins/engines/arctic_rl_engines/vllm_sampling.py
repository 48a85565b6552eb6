"""The ``vllm`` sampling engine: rollouts from vLLM with the log-prob of every sampled token."""

from __future__ import annotations

import numbers
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    DEFAULT_ADAPTER,
    SEED_MAX,
    SEED_MIN,
    EngineContext,
    InvalidRequestError,
    SamplingEngine,
)
from arctic_rl_engines.vllm_common import VLLMEngine, as_token_ids
from arctic_rl_engines.vllm_loop import GenerationLoop
from arctic_rl_engines.vllm_structured import parse_structured_outputs, to_vllm_structured

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from arctic_platform.rl.api import ArcticRLClientConfig


MAX_N = 4096
"""Most completions one prompt may ask for (``n``)."""
MAX_SEQUENCES = 65536
"""Most sequences (prompts x n) one generate request may ask for; more is a 422, not an OOM."""


def _wrap_seed(seed: int) -> int:
    """``seed`` folded into the signed 64-bit range (a derived seed past the top wraps)."""
    return (seed - SEED_MIN) % 2**64 + SEED_MIN


def _fail(key: str, rule: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(f"sampling_params[{key!r}] must be {rule}, got {value!r}")


def _int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise _fail(key, f"an integer >= {minimum}", value)
    return int(value)


def _float(
    key: str, value: Any, low: float, high: float | None = None, *, open_low: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(key, "a number", value)
    number = float(value)
    too_low = number <= low if open_low else number < low
    too_high = high is not None and number > high
    if too_low or too_high or number != number or number == float("inf"):
        if high is None:
            rule = f"a finite number {'>' if open_low else '>='} {low}"
        else:
            rule = f"a number in {'(' if open_low else '['}{low}, {high}]"
        raise _fail(key, rule, value)
    return number


@dataclass(frozen=True)
class SamplingSpec:
    """Validated sampling parameters; built from the ``sampling_params`` dict by ``parse``.

    ``seed`` makes a call reproducible: completion ``j`` of prompt ``i`` is sampled with seed
    ``seed + i * n + j``. ``logprobs`` (k) adds the top-k alternatives per sampled token as
    ``top_logprobs``; the sampled token's own log-prob is always returned.
    """

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int = 0
    min_tokens: int = 0
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: bool = False  # also each prompt token's log-prob (None for the first)
    structured_outputs: dict[str, Any] | None = None  # constrained decoding (vllm_structured)

    @classmethod
    def keys(cls) -> list[str]:
        """The accepted ``sampling_params`` keys."""
        return [f.name for f in fields(cls)]

    @classmethod
    def parse(cls, params: dict[str, Any] | None, max_logprobs: int = 20) -> SamplingSpec:
        """Check every key and value of ``params``; unknown keys and bad values are errors."""
        if params is None:
            return cls()
        if not isinstance(params, dict):
            raise InvalidRequestError(
                f"sampling_params must be a dict, got {type(params).__name__}"
            )
        unknown = sorted(set(params) - set(cls.keys()))
        if unknown:
            raise InvalidRequestError(
                f"sampling_params has unknown key(s) {unknown}; accepted: {cls.keys()}"
            )
        p = {k: v for k, v in params.items() if v is not None}
        out: dict[str, Any] = {}
        if "n" in p:
            out["n"] = _int("n", p["n"], 1)
            if out["n"] > MAX_N:
                raise _fail("n", f"an integer in [1, {MAX_N}]", p["n"])
        if "max_tokens" in p:
            out["max_tokens"] = _int("max_tokens", p["max_tokens"], 1)
        if "temperature" in p:
            out["temperature"] = _float("temperature", p["temperature"], 0.0)
        if "top_p" in p:
            out["top_p"] = _float("top_p", p["top_p"], 0.0, 1.0, open_low=True)
        if "top_k" in p:
            top_k = p["top_k"]
            if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < -1:
                raise _fail("top_k", "-1 or 0 (off) or an integer >= 1", top_k)
            out["top_k"] = max(int(top_k), 0)
        if "min_p" in p:
            out["min_p"] = _float("min_p", p["min_p"], 0.0, 1.0)
        if "seed" in p:
            seed = p["seed"]
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise _fail("seed", "an integer or None", seed)
            if not SEED_MIN <= int(seed) <= SEED_MAX:
                raise _fail("seed", "a signed 64-bit integer (or None)", seed)
            out["seed"] = int(seed)
        if "stop" in p:
            stop = [p["stop"]] if isinstance(p["stop"], str) else p["stop"]
            if not isinstance(stop, list | tuple) or not all(
                isinstance(s, str) and s for s in stop
            ):
                raise _fail("stop", "a non-empty string or a list of them", p["stop"])
            out["stop"] = list(stop)
        if "stop_token_ids" in p:
            ids = p["stop_token_ids"]
            if not isinstance(ids, list | tuple) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
            ):
                raise _fail("stop_token_ids", "a list of token ids", ids)
            out["stop_token_ids"] = list(ids)
        if "logprobs" in p:
            k = p["logprobs"]
            k = 0 if isinstance(k, bool) else k  # True/False: the sampled token's only
            if not isinstance(k, numbers.Integral) or not 0 <= int(k) <= max_logprobs:
                raise _fail(
                    "logprobs",
                    f"an integer in [0, {max_logprobs}] (top alternatives per token; raise "
                    "the limit with vllm_config max_logprobs)",
                    p["logprobs"],
                )
            out["logprobs"] = int(k)
        if "min_tokens" in p:
            out["min_tokens"] = _int("min_tokens", p["min_tokens"], 0)
        for key in (
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
            "prompt_logprobs",
        ):
            if key in p:
                if not isinstance(p[key], bool):
                    raise _fail(key, "true or false", p[key])
                out[key] = p[key]
        if "repetition_penalty" in p:
            out["repetition_penalty"] = _float(
                "repetition_penalty", p["repetition_penalty"], 0.0, open_low=True
            )
        for key in ("presence_penalty", "frequency_penalty"):
            if key in p:
                out[key] = _float(key, p[key], -2.0, 2.0)
        out["structured_outputs"] = parse_structured_outputs(p.get("structured_outputs"))
        spec = cls(**out)
        if spec.min_tokens > spec.max_tokens:
            raise InvalidRequestError(
                f"sampling_params['min_tokens']={spec.min_tokens} is more than "
                f"max_tokens={spec.max_tokens}"
            )
        return spec

    def to_vllm(self, seed: int | None = None) -> Any:
        """The ``vllm.SamplingParams`` for one prompt (``seed`` is that prompt's seed)."""
        from vllm import SamplingParams

        converted = {
            "seed": seed,
            "stop": list(self.stop) or None,
            "stop_token_ids": list(self.stop_token_ids) or None,
            "prompt_logprobs": 0 if self.prompt_logprobs else None,
            "structured_outputs": to_vllm_structured(self.structured_outputs),
        }
        as_is = {key: getattr(self, key) for key in self.keys() if key not in converted}
        return SamplingParams(**as_is, **converted)

    def per_prompt(self, count: int) -> list[Any]:
        """One ``vllm.SamplingParams`` per prompt; distinct seeds when ``seed`` is set."""
        if self.seed is None and self.structured_outputs is None:
            shared = self.to_vllm()
            return [shared] * count
        if self.seed is None:  # vLLM writes its backend into each constraint: one per prompt
            return [self.to_vllm() for _ in range(count)]
        return [self.to_vllm(_wrap_seed(self.seed + i * self.n)) for i in range(count)]


def version_spans(output: Any, fallback: int) -> list[list[int]]:
    """``[[version, start, end], ...]``: output tokens ``[start, end)`` were sampled under
    weight ``version`` (vLLM's spans; ``fallback`` when it reported none)."""
    spans = [
        [int(span.version), int(span.start), int(span.end)]
        for span in (getattr(output, "weight_versions", None) or [])
        if str(span.version).isdigit()
    ]
    return spans or [[fallback, 0, len(output.token_ids)]]


def completion_record(
    output: Any, top_k: int, version: int = 0, *, fixed: bool = False
) -> dict[str, Any]:
    """One vLLM ``CompletionOutput`` as the wire dict (sampled-token log-probs always set).

    ``weight_version_start``/``_end``: the weight versions of its first and last sampled
    token; a completion that saw a hotswap also has ``weight_version_spans``. ``fixed``:
    every token is of ``version`` (an adapter version, which never changes under a request).
    """
    token_ids = list(output.token_ids)
    steps = output.logprobs or []
    logprobs = [float(step[token].logprob) for token, step in zip(token_ids, steps, strict=True)]
    spans = [[version, 0, len(token_ids)]] if fixed else version_spans(output, version)
    record: dict[str, Any] = {
        "token_ids": token_ids,
        "text": output.text,
        "logprobs": logprobs,
        "finish_reason": output.finish_reason,
        "stop_reason": output.stop_reason,
        "weight_version_start": spans[0][0],
        "weight_version_end": spans[-1][0],
    }
    if len(spans) > 1:
        record["weight_version_spans"] = spans
    if top_k:
        record["top_logprobs"] = [top_pairs(step, top_k) for step in steps]
    return record


def top_pairs(step: dict[int, Any], k: int) -> list[list[float | int]]:
    """The ``k`` most likely ``[token_id, logprob]`` pairs of one position, best first."""
    ranked = sorted(
        ((lp.rank, token, float(lp.logprob)) for token, lp in step.items() if lp.rank <= k),
        key=lambda item: item[0],
    )
    return [[token, logprob] for _, token, logprob in ranked[:k]]


def prefix_cache_salt(version: int, adapter: str | None = None) -> str:
    """The prefix-cache salt of a request served by weight ``version`` (of ``adapter`` in LoRA
    mode): vLLM reuses cached blocks only between requests of the same salt, so a prefix
    computed under one version never serves another, even between a sync and the cache
    reset that follows it, or for a request still in flight across a hotswap."""
    return f"w{version}" if adapter is None else f"{adapter}@w{version}"


class VLLMSamplingEngine(VLLMEngine, SamplingEngine):
    """vLLM generation with in-place weight updates (the ``vllm`` sampling engine).

    Thread-safe: one loop thread (``vllm_loop``) owns vLLM, so concurrent ``generate`` calls
    share batches and weights are swapped between steps (``swap_weights``).

    ``logprobs`` are of the model's own distribution (vLLM's default ``logprobs_mode`` of
    ``raw_logprobs``: before temperature, top-p and top-k), which is what a trainer's forward
    computes; ``vllm_config={"logprobs_mode": "processed_logprobs"}`` gives the sampling
    distribution instead.
    """

    concurrent_methods = frozenset(
        {
            "generate",
            "reset_prefix_cache",
            "weight_norm",
            "sleep",
            "wake",
            "swap_weights",
            "load_adapter",
            "remove_adapter",
            "adapters",
        }
    )
    """Methods a host may call from several threads at once (they go through the loop)."""

    def __init__(self, config: ArcticRLClientConfig, context: EngineContext | None = None) -> None:
        super().__init__(config, context or EngineContext(role="sampling"))
        self.weight_version = 0
        self.llm.llm_engine.set_weight_version(str(self.weight_version))
        self.loop = GenerationLoop(
            self.llm.llm_engine, name="vllm-sampling-loop", ready=self._ready
        )
        self._tokenizer_lock = threading.Lock()
        self.last_swap: dict[str, Any] = {}

    def prompt_token_ids(self, prompts: list[str] | list[list[int]]) -> list[list[int]]:
        """Each prompt as token ids (strings tokenized as vLLM does), checked to fit the context."""
        if not isinstance(prompts, list | tuple):
            raise InvalidRequestError(
                f"prompts must be a list of strings or token-id lists, got {type(prompts).__name__}"
            )
        tokenizer = None
        out: list[list[int]] = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                tokenizer = tokenizer or self.tokenizer
                with self._tokenizer_lock:  # HF fast tokenizers are not safe to share
                    ids = list(tokenizer.encode(prompt))
            else:
                ids = as_token_ids(prompt, f"prompts[{i}]", self.vocab_size)
            if not ids:
                raise InvalidRequestError(f"prompts[{i}] is empty")
            if len(ids) >= self.max_model_len:
                raise InvalidRequestError(
                    f"prompts[{i}] has {len(ids)} tokens, too long for the context of "
                    f"{self.max_model_len} tokens (max_model_len) with at least one token to "
                    f"generate; shorten it to {self.max_model_len - 1} tokens or raise "
                    "vllm_config max_model_len"
                )
            out.append(ids)
        return out

    def _in_loop(self, function: Any, when: str = "now") -> Any:
        return self.loop.run(function, "idle" if when == "idle" else "now")

    def _requests_in_flight(self) -> int:
        return self.loop.counts()["running_requests"]

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: dict[str, Any] | None = None,
        adapter: str | None = None,
        adapter_version: int | None = None,
    ) -> list[dict[str, Any]]:
        """Per prompt: ``prompt_token_ids`` and ``n`` ``completions`` (token_ids, text,
        logprobs, finish_reason, stop_reason; ``top_logprobs`` when ``logprobs`` > 0), and
        ``prompt_logprobs`` when asked. LoRA jobs: served by ``adapter`` at ``adapter_version``
        (default: the default adapter's latest; ``"base"``: none), which the completions'
        ``weight_version_*`` report."""
        from vllm.inputs import TokensPrompt

        lora_request, adapter_at = self._lora_request(adapter, adapter_version)
        spec = SamplingSpec.parse(sampling_params, self.max_logprobs)
        if isinstance(prompts, list | tuple) and len(prompts) * spec.n > MAX_SEQUENCES:
            raise InvalidRequestError(
                f"{len(prompts)} prompts x n={spec.n} is {len(prompts) * spec.n} sequences; one "
                f"generate request may ask for at most {MAX_SEQUENCES}: split it"
            )
        token_ids = self.prompt_token_ids(prompts)
        if not token_ids:
            return []
        self._ready()
        lora_mode = self.adapter_store is not None
        version = (adapter_at or 0) if lora_mode else self.weight_version
        salt = prefix_cache_salt(version, adapter if lora_mode else None)
        call = self.loop.submit(
            [TokensPrompt(prompt_token_ids=ids, cache_salt=salt) for ids in token_ids],
            spec.per_prompt(len(token_ids)),
            [lora_request] * len(token_ids),
        )
        outputs = self.loop.wait(call)
        results = []
        for ids, output in zip(token_ids, outputs, strict=True):
            completions = sorted(output.outputs, key=lambda c: c.index)
            result: dict[str, Any] = {
                "prompt_token_ids": ids,
                "completions": [
                    completion_record(c, spec.logprobs, version, fixed=lora_mode)
                    for c in completions
                ],
            }
            if spec.prompt_logprobs:
                steps = list(output.prompt_logprobs or [])[1:]
                result["prompt_logprobs"] = [None] + [
                    float(step[token].logprob) for token, step in zip(ids[1:], steps, strict=True)
                ]
            results.append(result)
        return results

    def swap_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        *,
        strategy: str = "drain",
        version: int | None = None,
        bucket_bytes: int | None = None,
    ) -> dict[str, Any]:
        """Load new weights between two engine steps; returns what was swapped and when.

        ``drain``: no new request starts; the running ones finish under the old weights,
        then the swap. ``hotswap``: the swap happens with requests running; their KV cache is
        dropped and recomputed under the new weights, so their later tokens are the new
        model's given the text so far and their earlier ones the old model's
        (``weight_version_spans``). Either way no cached prefix from old weights survives.
        ``version`` labels the new weights (default: the current one + 1). LoRA mode: the
        weights are the trainer's adapter, loaded as the default adapter's ``version`` without
        any drain whatever the strategy (``load_adapter``).
        """
        from arctic_platform.rl.api import check_strategy

        check_strategy(strategy)
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise InvalidRequestError(f"version must be an integer, got {version!r}")
        if self.adapter_store is not None:
            loaded = self.load_adapter(
                DEFAULT_ADAPTER, self._next_version() if version is None else version, weights
            )
            self.weight_version = loaded["weight_version"]
            self.last_swap = loaded
            return dict(loaded)
        asked = time.monotonic()

        def swap() -> dict[str, Any]:
            in_flight = self.loop.counts()["running_requests"]
            started = time.monotonic()
            engine = self.llm.llm_engine
            # A multi-process engine core steps on its own: pause it for a hotswap, so no
            # step runs between the load, the KV reset and the new version label.
            pause = strategy == "hotswap" and in_flight > 0 and not self.in_process
            if pause:
                engine.engine_core.call_utility("pause_scheduler", "keep", False)
            try:
                self._load_weights(weights, bucket_bytes, reset_running=strategy == "hotswap")
                self.weight_version = self.weight_version + 1 if version is None else version
                engine.set_weight_version(str(self.weight_version))
            finally:
                if pause:
                    engine.engine_core.call_utility("resume_scheduler")
            return {
                "strategy": strategy,
                "weight_version": self.weight_version,
                "requests_in_flight": in_flight,
                "waited_seconds": started - asked,
                "load_seconds": time.monotonic() - started,
            }

        report = self.loop.run(swap, "idle" if strategy == "drain" else "now")
        self.last_swap = report
        return dict(report)

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None:
        """``swap_weights`` with the ``drain`` strategy (running requests finish first); in LoRA
        mode the default adapter's next version."""
        self.swap_weights(weights, strategy="drain", bucket_bytes=bucket_bytes)

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix, once the running requests have finished."""
        self.loop.run(self._reset_prefix_cache, "idle")

    def weight_norm(self) -> float:
        """L2 norm of the served checkpoint-format weights (read between two steps)."""
        return float(self.loop.run(super().weight_norm))

    def served_weight_norm(self) -> dict[str, Any]:
        """``VLLMEngine.served_weight_norm``, read between two steps."""
        return dict(self.loop.run(super().served_weight_norm))

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """``VLLMEngine.sleep`` once the running requests have finished."""
        parent = super().sleep
        return dict(self.loop.run(lambda: parent(level), "idle"))

    def wake(self) -> dict[str, Any]:
        """``VLLMEngine.wake``, between two steps."""
        return dict(self.loop.run(super().wake, "idle"))

    def loop_stats(self) -> dict[str, Any]:
        """Steps run and how many calls and requests shared them (see ``LoopStats``)."""
        return {**self.loop.stats.as_dict(), **self.loop.counts()}

    def close(self) -> None:
        """Stop the loop (waiting calls fail with EngineError), then shut vLLM down."""
        if self._llm is not None:
            self.loop.close("the vLLM engine was closed while this call waited")
        super().close()
