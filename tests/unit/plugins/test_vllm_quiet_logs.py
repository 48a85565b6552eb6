"""vLLM's per-sync log lines are kept out of long runs' logs; its other warnings still pass."""

from __future__ import annotations

import logging

from arctic_rl_engines.vllm_quiet_logs import (
    LAYERWISE_LOGGER,
    ROUTINE_PER_SYNC_LOGGERS,
    quiet_per_sync_logs,
)


def _passes(logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
    if not logger.isEnabledFor(level):
        return False
    record = logger.makeRecord(logger.name, level, "x.py", 1, msg, args, None)
    return bool(logger.filter(record))


def test_routine_sync_lines_are_dropped_and_real_warnings_kept():
    quiet_per_sync_logs()
    quiet_per_sync_logs()  # idempotent
    layerwise = logging.getLogger(LAYERWISE_LOGGER)
    assert len(layerwise.filters) == 1
    assert not _passes(layerwise, logging.WARNING, "%s: Failed to load weights", "RotaryEmbedding")
    assert _passes(layerwise, logging.WARNING, "%s: Failed to load weights", "QKVParallelLinear")
    assert _passes(layerwise, logging.WARNING, "something else %s", "RotaryEmbedding")
    for name in ROUTINE_PER_SYNC_LOGGERS:
        logger = logging.getLogger(name)
        assert not _passes(logger, logging.INFO, "Successfully reset prefix cache")
        assert _passes(logger, logging.WARNING, "a real problem")
