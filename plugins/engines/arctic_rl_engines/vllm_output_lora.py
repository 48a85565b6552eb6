"""LoRA on the output embedding (``lm_head``) for every vLLM model that has one.

vLLM serves a LoRA on ``lm_head`` (``LogitsProcessorWithLoRA``) only for model classes that
declare it in ``embedding_modules``: Llama and Qwen3 do, Qwen2 (and others) do not, so an
adapter trained with ``lm_head`` among its targets (Tinker's ``train_unembed``, its default)
was refused when loaded ("expected target modules in {...} but received ['lm_head', ...]").
Tied embeddings change nothing here: the adapter adds ``B A h`` to the logits only, as peft
does on the trainer's tied ``lm_head``; the input embedding stays the base's.

``install`` makes vLLM's LoRA model runner declare ``lm_head`` for a model whose ``lm_head``
is a ``ParallelLMHead`` before it builds its LoRA manager. The engine calls it before
starting vLLM in this process; the ``vllm.general_plugins`` entry point runs it in vLLM's
own engine processes (GPU). Idempotent.
"""

from __future__ import annotations

from typing import Any

OUTPUT_EMBEDDINGS = {"lm_head": "output_embeddings"}


def declare_lm_head(model: Any) -> bool:
    """Add ``lm_head`` to ``model.embedding_modules`` when its head is a ``ParallelLMHead``
    the class did not declare; True when it was added."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    declared = dict(getattr(model, "embedding_modules", None) or {})
    if "lm_head" in declared or not isinstance(getattr(model, "lm_head", None), ParallelLMHead):
        return False
    model.embedding_modules = {**declared, **OUTPUT_EMBEDDINGS}
    return True


def install() -> bool:
    """Patch vLLM's ``load_lora_model`` to ``declare_lm_head`` first (once per process);
    True when installed by this call."""
    from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

    original = LoRAModelRunnerMixin.load_lora_model
    if getattr(original, "_arctic_lm_head", False):
        return False

    def load_lora_model(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        declare_lm_head(model)
        return original(self, model, *args, **kwargs)

    load_lora_model._arctic_lm_head = True  # type: ignore[attr-defined]
    LoRAModelRunnerMixin.load_lora_model = load_lora_model  # type: ignore[method-assign]
    return True


__all__ = ["declare_lm_head", "install"]
