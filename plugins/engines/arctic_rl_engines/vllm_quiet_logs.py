"""Keep vLLM from logging on every weight sync (issue 27: a long run's logs must stay small).

Each in-place reload made vLLM 0.32 write three lines, about 440 B a sync per engine:
``Reloading and processing weights took …`` and ``Successfully reset prefix cache`` at INFO,
and ``RotaryEmbedding: Failed to load weights`` at WARNING. The first two are routine (our
engines record sync timings themselves); the third is wrong for us: a rotary embedding has no
weights in a checkpoint (its cos/sin cache is computed), vLLM keeps its tensors, and the
warning repeats forever. Other warnings of those loggers still pass.
"""

from __future__ import annotations

import logging

ROUTINE_PER_SYNC_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.v1.core.block_pool",
)
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
WEIGHTLESS_LAYERS = ("RotaryEmbedding",)


class WeightlessLayerFilter(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for layers that have no weights to load."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the reload warning of a weightless layer, True for anything else."""
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        return str(args[0]) not in WEIGHTLESS_LAYERS


def quiet_per_sync_logs() -> None:
    """Raise the per-sync INFO loggers to WARNING and filter the weightless-layer warning
    (idempotent: the filter is added once)."""
    for name in ROUTINE_PER_SYNC_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    layerwise = logging.getLogger(LAYERWISE_LOGGER)
    if not any(isinstance(f, WeightlessLayerFilter) for f in layerwise.filters):
        layerwise.addFilter(WeightlessLayerFilter())
