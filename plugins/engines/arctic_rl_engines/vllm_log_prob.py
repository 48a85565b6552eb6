"""The ``vllm`` log-prob engine: log-probs of given completions via vLLM's ``prompt_logprobs``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    Batch,
    BatchLimits,
    EngineContext,
    InvalidRequestError,
    LogProbEngine,
)
from arctic_rl_engines.lora_names import BASE_ADAPTER
from arctic_rl_engines.vllm_common import VLLMEngine, as_token_ids
from arctic_rl_engines.vllm_sampling import top_pairs

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.api import ArcticRLClientConfig


class VLLMLogProbEngine(VLLMEngine, LogProbEngine):
    """Scores ``prompt + completion`` in one prefill per pair (the ``vllm`` log-prob engine)."""

    def __init__(self, config: ArcticRLClientConfig, context: EngineContext | None = None) -> None:
        super().__init__(config, context or EngineContext(role="log_prob"))

    def _ids(self, value: Any, what: str, *, prompt: bool) -> list[int]:
        if isinstance(value, str):
            if prompt:
                return list(self.tokenizer.encode(value))
            return list(self.tokenizer.encode(value, add_special_tokens=False))
        return as_token_ids(value, what, self.vocab_size)

    def log_probs(
        self,
        prompts: list[list[int]] | list[str],
        completions: list[list[int]] | list[str],
        top_k: int = 1,
        adapter: str | None = None,
        adapter_version: int | None = None,
    ) -> list[dict[str, Any]]:
        """Per pair: ``log_probs`` (one per completion token), ``top_k`` (per token, the
        ``top_k`` best ``[token_id, logprob]`` pairs) and ``completion_token_ids``. LoRA jobs:
        scored with ``adapter`` at ``adapter_version`` (default: the default adapter's
        latest; ``"base"``: none)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        lora_request, _ = self._lora_request(adapter, adapter_version)
        if not isinstance(prompts, list | tuple) or not isinstance(completions, list | tuple):
            raise InvalidRequestError("prompts and completions must be lists")
        if len(prompts) != len(completions):
            raise InvalidRequestError(
                f"got {len(prompts)} prompts but {len(completions)} completions; one each"
            )
        if (
            isinstance(top_k, bool)
            or not isinstance(top_k, int)
            or not 0 <= top_k <= self.max_logprobs
        ):
            raise InvalidRequestError(
                f"top_k must be an integer in [0, {self.max_logprobs}] (raise the limit with "
                f"vllm_config max_logprobs), got {top_k!r}"
            )
        pairs = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            p = self._ids(prompt, f"prompts[{i}]", prompt=True)
            c = self._ids(completion, f"completions[{i}]", prompt=False)
            if not p:
                raise InvalidRequestError(
                    f"prompts[{i}] is empty: the first completion token needs a context"
                )
            if len(p) + len(c) >= self.max_model_len:
                raise InvalidRequestError(
                    f"prompts[{i}] + completions[{i}] is {len(p) + len(c)} tokens; the engine "
                    f"scores at most {self.max_model_len - 1} (max_model_len "
                    f"{self.max_model_len} minus one); shorten it or raise vllm_config "
                    "max_model_len"
                )
            pairs.append((p, c))
        results: list[dict[str, Any]] = [
            {"log_probs": [], "top_k": [], "completion_token_ids": c} for _, c in pairs
        ]
        todo = [i for i, (_, c) in enumerate(pairs) if c]
        if not todo:
            return results
        llm = self._ready()
        params = SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=top_k, detokenize=False
        )
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=pairs[i][0] + pairs[i][1]) for i in todo],
            params,
            use_tqdm=False,
            lora_request=lora_request,
        )
        for i, output in zip(todo, outputs, strict=True):
            prompt, completion = pairs[i]
            steps = output.prompt_logprobs[len(prompt) : len(prompt) + len(completion)]
            results[i]["log_probs"] = [
                float(step[token].logprob) for token, step in zip(completion, steps, strict=True)
            ]
            results[i]["top_k"] = (
                [top_pairs(step, top_k) for step in steps] if top_k else [[] for _ in steps]
            )
        return results

    def batch_limits(self) -> BatchLimits:
        """The vocabulary, and rows of at most ``max_model_len - 1`` tokens (one prefill
        scores a row and needs room for one more position)."""
        return BatchLimits(vocab_size=self.vocab_size, max_length=self.max_model_len - 1)

    def fwd_no_grad(
        self, batch: Batch | Mapping[str, Any], reference_model: bool = False
    ) -> list[list[float]]:
        """Per-token log-probs of each row's ``input_ids`` (entry 0 is 0.0), as a trainer gives;
        LoRA jobs: with the default adapter, or the base for ``reference_model``."""
        adapter = None
        if reference_model and self.adapter_store is not None:
            adapter = BASE_ADAPTER  # a LoRA trainer's reference: the base, adapter disabled
        elif reference_model:
            raise InvalidRequestError(
                "the vllm log-prob engine serves one model; reference_model=True needs the "
                "training engine's reference model"
            )
        clean = Batch.build(batch, limits=self.batch_limits())  # a server's Batch: as it is
        rows = [r.tolist() for r in clean.rows("input_ids")]
        scored = self.log_probs(
            [list(r[:1]) for r in rows], [list(r[1:]) for r in rows], top_k=0, adapter=adapter
        )
        return [[0.0, *item["log_probs"]] for item in scored]
