"""vLLM's own engine metrics (running/waiting requests, KV-cache use, tokens, time to first
token, ...) exported through Ray's metrics system, as ``ray_vllm_*`` series.

In an engine worker with metrics on (``metrics_enabled``) and Ray initialised, the engine is
built with ``disable_log_stats=False`` (unless ``vllm_config`` says otherwise) and its logger
manager is replaced by one holding only vLLM's ``RayPrometheusStatLogger`` (no periodic log
line, no process-local Prometheus registry nobody scrapes), its records going through the
process's metric buffers (``deferred_metrics``). vLLM's ``lora_requests_info``
gauge is dropped: its labels are the names of the adapters running, an unbounded set with
many LoRA models (``arctic_rl_lora_adapters`` counts them instead).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from arctic_platform.rl.api import deferred_metrics, metrics_enabled

logger = logging.getLogger(__name__)


def wanted() -> bool:
    """Whether vLLM's metrics go to Ray here: metrics on and Ray initialised."""
    ray = sys.modules.get("ray")
    return metrics_enabled() and ray is not None and bool(ray.is_initialized())


def stats_kwargs(overrides: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments that switch vLLM's stats on for the Ray logger (none when the user's
    ``vllm_config`` sets ``disable_log_stats`` or metrics are off)."""
    if "disable_log_stats" in overrides or not wanted():
        return {}
    return {"disable_log_stats": False}


def attach(llm: Any) -> bool:
    """Give ``llm`` (a ``vllm.LLM``) a logger manager with only vLLM's Ray stat logger;
    False (and the engine unchanged) when stats are off or vLLM's API differs."""
    engine = getattr(llm, "llm_engine", None)
    if engine is None or getattr(engine, "logger_manager", None) is None or not wanted():
        return False
    try:
        from vllm.v1.metrics import ray_wrappers
        from vllm.v1.metrics.loggers import StatLoggerManager

        # records into the process's metric buffers (handed to Ray by their flusher): no
        # call into Ray on the engine loop (and ray_wrappers' own import of ray.util.metrics
        # also needs ray[serve], absent here)
        ray_wrappers.ray_metrics = deferred_metrics
        manager = StatLoggerManager(
            vllm_config=engine.vllm_config,
            custom_stat_loggers=[ray_wrappers.RayPrometheusStatLogger],
            enable_default_loggers=False,
        )
        for stat_logger in manager.stat_loggers:
            if hasattr(stat_logger, "gauge_lora_info"):
                stat_logger.gauge_lora_info = None
        manager.log_engine_initialized()
        engine.logger_manager = manager
        return True
    except Exception as exc:  # the engine serves without its metrics
        logger.warning("vLLM metrics not exported through Ray: %s", exc)
        return False
