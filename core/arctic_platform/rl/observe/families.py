"""Every metric Arctic RL exports: name, kind, labels, meaning (the README's list is built from
this table and checked against it).

Names follow Prometheus conventions: ``arctic_rl_`` first (Ray adds ``ray_`` when it exports
them), base units (seconds, bytes), ``_total`` on counters. Label values stay bounded: job
types, operations, status codes, states; never a session, adapter, prompt or job id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Latency buckets (seconds) of every duration histogram."""


@dataclass(frozen=True)
class Family:
    """One metric: its name as recorded, kind, label names, and what it measures."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    source: str  # which process records it: server, worker

    @property
    def exported(self) -> str:
        """The series name Prometheus scrapes (Ray's ``ray_`` prefix; histograms add
        ``_bucket``/``_count``/``_sum``)."""
        return f"ray_{self.name}"


def _family(name: str, kind: Kind, labels: tuple[str, ...], help: str, source: str) -> Family:
    return Family(name, kind, labels, help, source)


FAMILIES: tuple[Family, ...] = (
    # --- the server ------------------------------------------------------------------------
    _family(
        "arctic_rl_requests_total",
        "counter",
        ("operation", "job_type", "status"),
        "Requests the server answered, by operation, job type and HTTP status (200 for success).",
        "server",
    ),
    _family(
        "arctic_rl_request_duration_seconds",
        "histogram",
        ("operation", "job_type"),
        "Seconds from a request's arrival at the server to its answer.",
        "server",
    ),
    _family(
        "arctic_rl_requests_in_flight",
        "gauge",
        ("operation",),
        "Requests the server is working on now.",
        "server",
    ),
    _family(
        "arctic_rl_request_errors_total",
        "counter",
        ("operation", "status", "code"),
        "Refused or failed requests by HTTP status and error code (invalid_request, ...).",
        "server",
    ),
    _family(
        "arctic_rl_http_bytes_total",
        "counter",
        ("direction", "api"),
        "Bytes of HTTP request bodies received (in) and response bodies sent (out), by API.",
        "server",
    ),
    _family(
        "arctic_rl_jobs",
        "gauge",
        ("job_type", "state"),
        "Jobs by type and state (pending, placing, initializing, running, failed, ...).",
        "server",
    ),
    _family(
        "arctic_rl_job_starts_total",
        "counter",
        ("job_type", "reason"),
        "Jobs started: created by initialize (create) or started again by restart_job (restart).",
        "server",
    ),
    # --- weight sync (recorded by the server) ------------------------------------------------
    _family(
        "arctic_rl_weight_sync_total",
        "counter",
        ("kind",),
        "Weight syncs done, full weights or adapter.",
        "server",
    ),
    _family(
        "arctic_rl_weight_sync_bytes_total",
        "counter",
        ("kind",),
        "Bytes the weight syncs moved into the samplers and log-prob jobs.",
        "server",
    ),
    _family(
        "arctic_rl_weight_sync_duration_seconds",
        "histogram",
        ("kind",),
        "Seconds of a whole weight sync (gather, send, swap in).",
        "server",
    ),
    _family(
        "arctic_rl_weight_version",
        "gauge",
        ("job_type",),
        "The newest weight version synced (training: the version sent; others: received).",
        "server",
    ),
    # --- agent sessions (recorded by the server) ---------------------------------------------
    _family(
        "arctic_rl_agent_sessions_open",
        "gauge",
        (),
        "Agent sessions open now.",
        "server",
    ),
    _family(
        "arctic_rl_agent_turns_total",
        "counter",
        ("segment",),
        "Agent turns answered: continuing a segment (extend) or starting one (new).",
        "server",
    ),
    _family(
        "arctic_rl_agent_prefix_breaks_total",
        "counter",
        (),
        "Agent turns whose history did not extend an earlier turn's tokens (a new segment).",
        "server",
    ),
    # --- engines (recorded in each worker) ---------------------------------------------------
    _family(
        "arctic_rl_engine_call_duration_seconds",
        "histogram",
        ("job_type", "operation"),
        "Seconds an engine call took in its worker (fwd_bwd, step, generate, log_probs, ...).",
        "worker",
    ),
    _family(
        "arctic_rl_engine_tokens_total",
        "counter",
        ("job_type", "operation"),
        "Tokens an engine processed: trained tokens of fwd_bwd, scored tokens, sampled tokens.",
        "worker",
    ),
    _family(
        "arctic_rl_engine_tokens_per_second",
        "gauge",
        ("job_type", "operation"),
        "Tokens a second of the engine's last call of that operation.",
        "worker",
    ),
    _family(
        "arctic_rl_train_steps_total",
        "counter",
        ("job_type",),
        "Optimizer steps taken.",
        "worker",
    ),
    _family(
        "arctic_rl_train_grad_norm",
        "gauge",
        ("job_type",),
        "Gradient norm of the last optimizer step (before clipping).",
        "worker",
    ),
    _family(
        "arctic_rl_train_learning_rate",
        "gauge",
        ("job_type",),
        "Learning rate of the last optimizer step.",
        "worker",
    ),
    _family(
        "arctic_rl_train_flops_per_second",
        "gauge",
        ("job_type", "operation"),
        "Model FLOPs a second of the last training call (6 x parameters x tokens for a "
        "forward/backward, 2 x for a forward).",
        "worker",
    ),
    _family(
        "arctic_rl_train_mfu",
        "gauge",
        ("job_type", "operation"),
        "Model FLOPs utilisation of the last training call: FLOPs a second over the device's "
        "peak (ARCTIC_RL_PEAK_FLOPS, or the GPU's known bf16 peak); absent when unknown.",
        "worker",
    ),
    _family(
        "arctic_rl_peak_memory_bytes",
        "gauge",
        ("job_type", "device"),
        "Peak memory of a worker: the GPU's allocated peak (cuda), else the process's peak "
        "resident set (cpu).",
        "worker",
    ),
    # --- LoRA pools (recorded by the Tinker front-end) ----------------------------------------
    _family(
        "arctic_rl_lora_adapters",
        "gauge",
        ("state",),
        "LoRA adapters of the Tinker pools: live (in a trainer's parameters) or parked.",
        "server",
    ),
    _family(
        "arctic_rl_lora_swaps_total",
        "counter",
        (),
        "Adapters swapped into a pool's trainer (a model's call on a parked adapter).",
        "server",
    ),
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
"""The families by recorded name."""

VLLM_FAMILIES = (
    "ray_vllm_num_requests_running",
    "ray_vllm_num_requests_waiting",
    "ray_vllm_kv_cache_usage_perc",
    "ray_vllm_prompt_tokens_total",
    "ray_vllm_generation_tokens_total",
    "ray_vllm_time_to_first_token_seconds",
    "ray_vllm_e2e_request_latency_seconds",
)
"""vLLM's own sampler metrics (its Ray stat logger; not re-implemented here) that the
dashboard and the README rely on; vLLM exports more."""


def markdown_table() -> str:
    """The README's list of metrics: series name, kind, labels, meaning."""
    lines = ["| series (as scraped) | kind | labels | meaning |", "|---|---|---|---|"]
    for f in FAMILIES:
        labels = ", ".join(f"`{label}`" for label in f.labels) or "-"
        lines.append(f"| `{f.exported}` | {f.kind} | {labels} | {f.help} |")
    return "\n".join(lines)


README_BEGIN = "<!-- metrics:begin (generated from arctic_platform.rl.observe.families) -->"
README_END = "<!-- metrics:end -->"


def readme_section() -> str:
    """The README's metric list between its markers (a test keeps the two in step)."""
    return f"{README_BEGIN}\n{markdown_table()}\n{README_END}"
