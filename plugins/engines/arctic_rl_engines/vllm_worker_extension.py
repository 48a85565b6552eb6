"""Methods mixed into vLLM's worker (``worker_extension_cls``): in-place weights and norms.

vLLM imports this module inside each of its workers, in this process or in its engine
subprocesses, and adds ``ArcticWorkerExtension`` to the worker's bases; the engine calls the
methods by name through ``LLM.collective_rpc``. Weights arrive as a dict of tensors when the
worker shares the engine's process, or as safetensors bytes when it does not, never as a
pickled callable. The module imports nothing heavy at import time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Checkpoint names vLLM's loaders skip on purpose: they are never served weights.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_SUMSQ_CHUNK = 1 << 24  # elements per float64 chunk when summing squares
# vLLM's notes about weights a reload did not touch; expected when an update comes in buckets.
_PARTIAL_RELOAD_NOTES = {
    "vllm.model_executor.model_loader.reload.layerwise": "%s: Failed to load weights",
    "vllm.model_executor.model_loader.reload.inplace": (
        "Following weights were not loaded from checkpoint: %s"
    ),
}


def sum_of_squares(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """Sum of squared elements in float64, optionally after casting to ``dtype`` (as served)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if dtype is not None and flat.is_floating_point() and flat.dtype != dtype:
        flat = flat.to(dtype)
    total = 0.0
    for chunk in flat.split(_SUMSQ_CHUNK):
        total += float(chunk.to(torch.float64).square().sum().item())
    return total


def fused_groups(packed: dict[str, list[str]], names: Iterable[str]) -> list[str]:
    """Problems with fused modules in ``names``: a ``q_proj`` without its ``k_proj``/``v_proj``.

    vLLM serves q/k/v (and gate/up) as one fused tensor, so a reload must bring all parts
    of a fused module together; otherwise the missing parts would be left uninitialised.
    """
    present = set(names)
    problems: list[str] = []
    for name in sorted(present):
        parts = name.split(".")
        for i, part in enumerate(parts):
            for fused, members in packed.items():
                if part not in members:
                    continue
                siblings = [".".join([*parts[:i], m, *parts[i + 1 :]]) for m in members]
                missing = [s for s in siblings if s not in present]
                if missing:
                    problems.append(
                        f"{name} is part of fused {fused!r}, but this update lacks "
                        f"{', '.join(missing)}"
                    )
    return problems


class _DropPartialReloadNotes(logging.Filter):
    """Hides vLLM's 'weights not loaded' notes while one bucket of a larger update reloads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _PARTIAL_RELOAD_NOTES.values()


class ArcticWorkerExtension:
    """Worker-side half of the vLLM engines: reload weights in place, report their norm.

    The norm is kept per checkpoint-format tensor (name -> float64 sum of squares): first
    from the checkpoint vLLM loaded, then from every tensor reloaded. On CPU vLLM hands the
    linear weights to oneDNN and empties the parameters, so the served tensors cannot be
    read back; the record is of exactly the tensors that were fed to ``reload_weights``.
    """

    _arctic_sumsq: dict[str, float] | None = None
    _arctic_shapes: dict[str, list[int]] | None = None

    def _arctic_model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _arctic_tied(self) -> bool:
        hf_config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
        return bool(getattr(text_config, "tie_word_embeddings", False))

    def _arctic_counted(self, name: str) -> bool:
        if name.endswith(_IGNORED_SUFFIXES):
            return False
        return not (self._arctic_tied() and name.startswith("lm_head."))

    def _arctic_dtype(self) -> torch.dtype:
        return self.model_runner.model_config.dtype  # type: ignore[attr-defined]

    def _arctic_record(self) -> dict[str, float]:
        if self._arctic_sumsq is None:
            from vllm.model_executor.model_loader import get_model_loader

            config = self.vllm_config  # type: ignore[attr-defined]
            loader = get_model_loader(config.load_config)
            all_weights = getattr(loader, "get_all_weights", None)
            if all_weights is None:
                raise RuntimeError(
                    f"cannot read the checkpoint for its norm: load format "
                    f"{config.load_config.load_format!r} has no weight iterator"
                )
            dtype = self._arctic_dtype()
            record: dict[str, float] = {}
            shapes: dict[str, list[int]] = {}
            for name, tensor in all_weights(config.model_config, self._arctic_model()):
                if self._arctic_counted(name):
                    record[name] = sum_of_squares(tensor, dtype)
                    shapes[name] = list(tensor.shape)
            self._arctic_sumsq, self._arctic_shapes = record, shapes
        return self._arctic_sumsq

    def arctic_check_weights(self, items: list[tuple[str, list[int]]]) -> list[str]:
        """Problems that would stop ``(name, shape)`` items from loading: unknown names,
        split fused modules, shapes unlike the checkpoint's. Nothing is loaded."""
        self._arctic_record()
        checkpoint_shapes = self._arctic_shapes or {}
        names = [name for name, _ in items]
        wrong = [
            f"{name} has shape {list(shape)}, the checkpoint {checkpoint_shapes[name]}"
            for name, shape in items
            if name in checkpoint_shapes and list(shape) != checkpoint_shapes[name]
        ]
        model = self._arctic_model()
        packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
        known = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        problems = fused_groups(packed, names) + wrong[:5]
        unknown: list[str] = []
        for name in names:
            if not self._arctic_counted(name):
                continue
            mapped: str | None = name
            if mapper is not None:
                mapped = mapper.map_name(name)
                if mapped is None:  # the model's loader drops this name on purpose
                    continue
            candidates = {mapped}
            for fused, members in packed.items():
                for member in members:
                    token = f".{member}."
                    if token in f".{mapped}.":
                        candidates.add(f".{mapped}.".replace(token, f".{fused}.").strip("."))
            if not candidates & known:
                unknown.append(name)
        if unknown:
            shown = ", ".join(unknown[:5]) + (
                f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""
            )
            problems.append(f"{len(unknown)} name(s) match no weight of the served model: {shown}")
        return problems

    def arctic_load_weights(
        self, weights: bytes | dict[str, torch.Tensor], bucketed: bool = False
    ) -> dict[str, Any]:
        """Reload the given checkpoint-format tensors in place; returns counts and seconds.

        ``bucketed`` says this is one bucket of a larger update, so vLLM's notes about the
        weights it did not touch are expected and hidden.
        """
        import time

        from arctic_rl_engines.vllm_quiet_logs import quiet_per_sync_logs

        quiet_per_sync_logs()  # the worker may be another process than the engine's
        started = time.perf_counter()
        if isinstance(weights, bytes | bytearray | memoryview):
            from safetensors.torch import load

            tensors = load(bytes(weights))
        else:
            tensors = dict(weights)
        model = self._arctic_model()
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        problems = fused_groups(packed, tensors)
        if problems:
            raise ValueError("; ".join(problems))
        record = self._arctic_record()  # read the checkpoint norms before they are replaced
        dtype = self._arctic_dtype()
        quiet = _DropPartialReloadNotes()
        loggers = [logging.getLogger(name) for name in _PARTIAL_RELOAD_NOTES] if bucketed else []
        for log in loggers:
            log.addFilter(quiet)
        try:
            self.model_runner.reload_weights(  # type: ignore[attr-defined]
                weights_iterator=iter(tensors.items()), is_checkpoint_format=True
            )
        finally:
            for log in loggers:
                log.removeFilter(quiet)
        if self._arctic_tied():
            self._arctic_refresh_tied_head()
        for name, tensor in tensors.items():
            if self._arctic_counted(name):
                record[name] = sum_of_squares(tensor, dtype)
                if self._arctic_shapes is not None:
                    self._arctic_shapes[name] = list(tensor.shape)
        return {"tensors": len(tensors), "seconds": time.perf_counter() - started}

    def _arctic_refresh_tied_head(self) -> None:
        """Re-tie the LM head to the reloaded input embedding and redo its kernel set-up.

        A tied head is its own module sharing the embedding's weight; on CPU its GEMM kernel
        keeps a packed copy made at load time, and a reload processes only the modules whose
        weights it was given (the embedding), so the head kept computing with the old weights.
        """
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            VocabParallelEmbedding,
        )

        model = self._arctic_model()
        modules = list(model.modules())
        embeds = [
            m
            for m in modules
            if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
        ]
        heads = [m for m in modules if isinstance(m, ParallelLMHead)]
        if len(embeds) != 1:
            return
        for head in heads:
            head.weight = embeds[0].weight
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)

    def arctic_weight_sumsq(self) -> float:
        """Sum of squares (float64) over the checkpoint-format weights this worker serves."""
        return float(sum(self._arctic_record().values()))

    def arctic_served_sumsq(self) -> dict[str, Any]:
        """Sum of squares (float64) of the tensors this worker computes with, in kernel format.

        Parameters are read directly; a linear weight handed to a CPU GEMM kernel (its
        parameter left empty) is read back by running the layer on an identity matrix,
        ``I @ W.T == W.T`` exactly. Fused q/k/v and gate/up count once, as the sum of their
        parts. Replicated tensors count once per worker, so this is exact at TP size 1.
        """
        import torch
        from vllm.model_executor.layers.linear import LinearBase

        total = 0.0
        read_back: list[str] = []
        for module_name, module in self._arctic_model().named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                if param.numel() > 0:
                    total += sum_of_squares(param)
                    continue
                if not (isinstance(module, LinearBase) and param_name == "weight"):
                    raise RuntimeError(f"{module_name}.{param_name} is empty and unreadable")
                size = int(module.input_size_per_partition)  # type: ignore[arg-type]
                with torch.no_grad():
                    eye = torch.eye(size, dtype=param.dtype, device=param.device)
                    weight_t = module.quant_method.apply(module, eye, None)
                total += sum_of_squares(weight_t)
                read_back.append(f"{module_name}.{param_name}")
        return {"sumsq": total, "read_back": read_back}

    def arctic_lora_fixes(self) -> dict[str, bool]:
        """Install the LoRA fixes this vLLM needs (see the two methods below); what was done."""
        return {
            "prompt_logprobs": self.arctic_lora_prompt_logprobs(),
            "cpu_base_rows": mask_cpu_base_rows(),
        }

    def arctic_lora_prompt_logprobs(self) -> bool:
        """Make prompt log-probs use each request's own adapter on a LoRA LM head.

        vLLM computes one request's prompt logits at a time, but its LoRA LM head applies the
        batch's per-request adapter indices to them: with several requests this fails (or,
        with one, would mix adapters). During that computation each call gets its request's
        adapter index for every row instead. True when the fix was installed.
        """
        from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA

        runner: Any = self.model_runner  # type: ignore[attr-defined]
        model = runner.model
        wrappers = {
            id(m.punica_wrapper): m.punica_wrapper
            for m in model.modules()
            if isinstance(m, LogitsProcessorWithLoRA)
        }
        if not wrappers or getattr(runner, "_arctic_prompt_lora", False):
            return False
        original = runner._get_prompt_logprobs_dict

        def prompt_logprobs(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            num_reqs = int(runner.input_batch.num_reqs)
            if any(w.indices_len[1] != num_reqs for w in wrappers.values()):
                return original(hidden_states, *args, **kwargs)  # not one index per request
            starts = runner.query_start_loc.np[: num_reqs + 1]
            compute = model.compute_logits

            def one_request(rows: torch.Tensor, *a: Any, **k: Any) -> Any:
                import numpy as np

                offset = rows.storage_offset() - hidden_states.storage_offset()
                first = offset // hidden_states.stride(0)
                request = int(np.searchsorted(starts, first, side="right")) - 1
                with _RequestRows(list(wrappers.values()), request, rows.shape[0]):
                    return compute(rows, *a, **k)

            model.compute_logits = one_request
            try:
                return original(hidden_states, *args, **kwargs)
            finally:
                del model.compute_logits

        runner._get_prompt_logprobs_dict = prompt_logprobs
        runner._arctic_prompt_lora = True
        return True


class _RequestRows:
    """While open, the LoRA LM heads' sampler indices are ``rows`` copies of one request's."""

    def __init__(self, wrappers: list[Any], request: int, rows: int) -> None:
        self.wrappers, self.request, self.rows = wrappers, request, rows
        self.saved: list[tuple[Any, int]] = []

    def __enter__(self) -> None:
        for wrapper in self.wrappers:
            index = wrapper._sampler_indices[self.request].clone()
            kept = wrapper._sampler_indices[: self.rows].clone()
            self.saved.append((kept, wrapper.indices_len[1]))
            wrapper._sampler_indices[: self.rows] = index
            wrapper.indices_len[1] = self.rows

    def __exit__(self, *exc: object) -> None:
        for wrapper, (kept, length) in zip(self.wrappers, self.saved, strict=True):
            wrapper._sampler_indices[: self.rows] = kept
            wrapper.indices_len[1] = length
        self.saved.clear()


def mask_cpu_base_rows() -> bool:
    """Make vLLM's CPU LoRA ops leave rows without an adapter alone (once per process).

    A row served by the base has adapter index -1, which the torch ops (``torch_ops``) use as
    a plain index: the last LoRA slot, so once every slot holds an adapter, base rows in the
    batch got that adapter's update. The shrink step now zeroes those rows, so the expand step
    that follows adds nothing to them. True when installed by this call.
    """
    import vllm.lora.ops.torch_ops.lora_ops as ops
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    if getattr(ops.bgmv_shrink, "_arctic_masked", False):
        return False
    original = ops.bgmv_shrink

    def bgmv_shrink(
        inputs: torch.Tensor,
        weights: torch.Tensor,
        output_tensor: torch.Tensor,
        indices: torch.Tensor,
        scaling: float = 1.0,
    ) -> None:
        original(inputs, weights, output_tensor, indices, scaling)
        if indices.numel() == output_tensor.shape[0]:
            output_tensor[indices < 0] = 0
        elif indices.numel() == 1 and int(indices.reshape(-1)[0]) < 0:
            output_tensor.zero_()

    bgmv_shrink._arctic_masked = True  # type: ignore[attr-defined]
    ops.bgmv_shrink = bgmv_shrink  # sgmv_shrink calls it from this module
    punica_cpu.bgmv_shrink = bgmv_shrink  # type: ignore[attr-defined]
    return True
