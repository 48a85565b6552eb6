"""A weight sync into a real vLLM engine logs nothing at INFO or above (issue 27: a long run's
log grew ~440 B a sync per engine). The control, with vLLM's loggers as vLLM leaves them and
the quieting turned off, shows the lines the check would catch; then the loggers are put back
as vLLM leaves them and the engine's own sync must quiet them (the test never does)."""

from __future__ import annotations

import logging
from pathlib import Path

from arctic_rl_engines.vllm_quiet_logs import (
    LAYERWISE_LOGGER,
    ROUTINE_PER_SYNC_LOGGERS,
    WeightlessLayerFilter,
)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _sync_lines(engine, state, syncs: int) -> list[str]:
    """What vLLM logged at INFO or above during ``syncs`` reloads of ``state``."""
    collect = _Collect()
    root = logging.getLogger("vllm")
    root.addHandler(collect)
    try:
        for _ in range(syncs):
            engine.load_weights(list(state.items()))
    finally:
        root.removeHandler(collect)
    return [r.getMessage() for r in collect.records if r.levelno >= logging.INFO]


def _as_vllm_leaves_them() -> None:
    for name in ROUTINE_PER_SYNC_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    layerwise = logging.getLogger(LAYERWISE_LOGGER)
    for f in [f for f in layerwise.filters if isinstance(f, WeightlessLayerFilter)]:
        layerwise.removeFilter(f)


def test_a_weight_sync_logs_nothing_at_info_or_above(
    vllm_log_prob_engine, tiny_model_path, monkeypatch
):
    from safetensors.torch import load_file

    import arctic_rl_engines.vllm_quiet_logs as quiet_logs

    state = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    with monkeypatch.context() as patch:  # the control: vLLM's loggers untouched
        patch.setattr(quiet_logs, "quiet_per_sync_logs", lambda: None)
        _as_vllm_leaves_them()
        control = _sync_lines(vllm_log_prob_engine, state, 1)
    _as_vllm_leaves_them()  # as a fresh vLLM process has them: only the sync itself may quiet
    assert _sync_lines(vllm_log_prob_engine, state, 3) == []
    assert any("Reloading and processing weights" in line for line in control), control
