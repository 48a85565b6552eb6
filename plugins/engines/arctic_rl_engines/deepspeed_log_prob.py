"""The ``deepspeed`` log-prob engine: forward-only log-probs, no optimizer state.

Configured by ``log_prob_ds_config``: our keys ``dtype``, ``max_tokens_per_mb``,
``attn_impl`` and ``fp32_lm_head`` (logits in float32 beside lower-precision weights), the
rest a DeepSpeed config (ZeRO-3 shards the weights over the job's ranks; stages 0-2 keep a
plain replica). The forward path is the training engine's own
(``arctic_rl_engines.logprobs``). In LoRA mode (``training_config.lora``) the base is wrapped
by peft like the trainer's, weight loads carry the adapter only, and named adapter versions
are served per call (``ds_lora_serving``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    DEFAULT_ADAPTER,
    Batch,
    BatchError,
    BatchLimits,
    EngineContext,
    InvalidRequestError,
    LogProbEngine,
)
from arctic_rl_engines import ds_checkpoint, ds_env, ds_lora, ds_model
from arctic_rl_engines.ds_config import forward_setup
from arctic_rl_engines.ds_lora_serving import BASE_ADAPTER, AdapterServing
from arctic_rl_engines.logprobs import rows_log_probs

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from arctic_platform.rl.api import ArcticRLClientConfig

SLEEP_UNSUPPORTED = (
    "sleep/wake are not implemented for the DeepSpeed log-prob engine: weights stay in memory"
)


class DeepSpeedLogProbEngine(AdapterServing, LogProbEngine):
    """Log-probs (and top-k alternatives) of completions under the served weights."""

    def __init__(self, config: ArcticRLClientConfig, context: EngineContext | None = None) -> None:
        import transformers

        self.config = config
        self._rank, self._world = ds_env.setup(context)
        self._device = ds_env.device()
        self.setup = forward_setup(config.log_prob_ds_config, on_cpu=ds_env.on_cpu())
        transformers.set_seed(config.seed)
        resume, source = ds_checkpoint.start_point(config.checkpoint_path, config.model_name)
        self._lora = lora = ds_lora.lora_of(config)
        self._serving_start()
        if resume is not None:
            meta = ds_checkpoint.read_marker(resume)
            ds_lora.check_mode(meta, lora, resume)
            if lora is not None:  # the run's base; its adapter is loaded below
                source = ds_checkpoint.base_source(meta, config.model_name)
        self._model = ds_model.ForwardModel(
            source,
            ds_config=self.setup.ds_config,
            dtype=self.setup.dtype,
            zero_stage=3 if self.setup.zero_stage == 3 else 0,
            attn_impl=self.setup.attn_impl,
            fp32_lm_head=self.setup.fp32_lm_head,
            device=self._device,
            prepare=None if lora is None else lambda m: ds_lora.wrap(m, lora, config.seed),
        )
        self._vocab, self._max_len, self._pad_id = ds_model.model_limits(self._model.config)
        if lora is not None and resume is not None:  # the checkpoint's adapter, as version 0
            tensors = ds_lora.load_adapter(resume / ds_lora.ADAPTER_DIR)
            self.load_adapter(DEFAULT_ADAPTER, 0, tensors.items())

    def batch_limits(self) -> BatchLimits:
        """The model's vocabulary and context: what a batch must keep."""
        return BatchLimits(vocab_size=self._vocab, max_length=self._max_len)

    def _run(self, rows: list[Any], top_k: int = 0, top_k_from: list[int] | None = None):
        return rows_log_probs(
            self._model,
            rows,
            device=self._device,
            pad_id=self._pad_id,
            max_tokens=self.setup.max_tokens_per_mb,
            rank=self._rank,
            world=self._world,
            top_k=top_k,
            top_k_from=top_k_from,
        )

    def log_probs(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        top_k: int = 1,
        adapter: str | None = None,
        adapter_version: int | None = None,
    ) -> list[dict[str, Any]]:
        """Per pair: ``log_probs`` of each completion token and, per token, ``top_k`` lists
        of ``[token_id, logprob]`` (likeliest first) of the distribution it was drawn from;
        LoRA mode: under ``adapter`` at ``adapter_version`` (``ds_lora_serving``)."""
        if len(prompts) != len(completions):
            raise BatchError(
                f"{len(prompts)} prompts but {len(completions)} completions; give one each"
            )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= self._vocab:
            raise InvalidRequestError(
                f"top_k={top_k!r} must be an integer in [0, {self._vocab}] (the vocabulary size)"
            )
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not isinstance(p, list | tuple) or len(p) == 0:
                raise BatchError(f"prompts[{i}] must be a non-empty list of token ids")
            if not isinstance(completions[i], list | tuple):
                raise BatchError(f"completions[{i}] must be a list of token ids")
        rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        checked = Batch.build(
            {"input_ids": rows, "loss_mask": [[1] * len(r) for r in rows]},
            limits=self.batch_limits(),
        )
        starts = [len(p) for p in prompts]
        with self._serving(adapter, adapter_version):
            results = self._run(checked.rows("input_ids"), top_k=top_k, top_k_from=starts)
        out = []
        for start, res in zip(starts, results, strict=True):
            n = len(res.log_probs) - start
            if top_k and res.top_ids is not None and res.top_log_probs is not None:
                alternatives = [
                    [[int(t), float(v)] for t, v in zip(ids, vals, strict=True)]
                    for ids, vals in zip(res.top_ids, res.top_log_probs, strict=True)
                ]
            else:
                alternatives = [[] for _ in range(n)]
            out.append({"log_probs": res.log_probs[start:], "top_k": alternatives})
        return out

    def fwd_no_grad(
        self,
        batch: Batch | Mapping[str, Any],
        reference_model: bool = False,
        adapter: str | None = None,
        adapter_version: int | None = None,
    ) -> list[list[float]]:
        """Per-token log-probs of each row's ``input_ids`` (entry 0 is 0.0); LoRA mode:
        under ``adapter``, and ``reference_model`` is the base (the adapter switched off)."""
        if reference_model and self._lora is not None:
            adapter, adapter_version = BASE_ADAPTER, None
        elif reference_model:
            raise InvalidRequestError(
                "the log-prob engine serves one set of weights; reference log-probs come "
                "from the training job (fwd_no_grad with reference_model=True there)"
            )
        clean = Batch.build(batch, limits=self.batch_limits())  # a server's Batch: as it is
        with self._serving(adapter, adapter_version):
            return [r.log_probs for r in self._run(clean.rows("input_ids"))]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights (Hugging Face names) into the model in place; collective under ZeRO-3.

        In LoRA mode: exactly the adapter's tensors (peft export names), kept as the default
        adapter's next version; anything else, or adapter tensors in full mode, is an
        ``InvalidRequestError`` and nothing is loaded.
        """
        if self._lora is not None:
            self.load_adapter(DEFAULT_ADAPTER, self._next_default_version(), weights)
        else:
            ds_model.load_weights(self._model.module, ds_lora.refuse_adapter(weights))

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full CPU tensors under Hugging Face names (collective under ZeRO-3); in LoRA mode
        only the adapter's, under peft's export names."""
        if self._lora is not None:
            with self._serving(None, None):
                return iter(ds_lora.export(self._model.module).items())
        return ds_model.full_weights(self._model.module)

    def weight_norm(self) -> float:
        """L2 norm of all weights (float64 accumulation)."""
        return ds_model.weight_norm(self._model.module)

    def reset_prefix_cache(self) -> None:
        """Nothing is cached between calls."""

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """A documented no-op."""
        return {"supported": False, "reason": SLEEP_UNSUPPORTED, "level": level}

    def wake(self) -> dict[str, Any]:
        """A documented no-op."""
        return {"supported": False, "reason": SLEEP_UNSUPPORTED}

    def close(self) -> None:
        """Free the model."""
        if getattr(self, "_model", None) is not None:
            self._model.close()
            self._model = None  # type: ignore[assignment]
        gc.collect()
