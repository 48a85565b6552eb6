"""What an engine worker records about each engine call (``families``): its seconds, the
tokens it processed and their rate, a training step's figures, FLOPs and peak memory.

Only rank 0 of a training job counts tokens (every rank sees the whole batch), so a job's
token rate is its batch's tokens over the call's seconds.
"""

from __future__ import annotations

import os
from typing import Any

from arctic_platform.rl.observe import recorder

PEAK_FLOPS = "ARCTIC_RL_PEAK_FLOPS"
"""Environment: the device's peak FLOPs a second, for the MFU estimate."""

KNOWN_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}
"""Dense bf16 peaks of common GPUs (per device), matched in the CUDA device name."""

FLOPS_PER_TOKEN = {"fwd_bwd": 6.0, "fwd_no_grad": 2.0}
"""Model FLOPs per parameter and token: forward and backward, or forward only."""


def peak_flops() -> float | None:
    """The device's peak FLOPs a second: ``ARCTIC_RL_PEAK_FLOPS``, else a known GPU's."""
    given = os.environ.get(PEAK_FLOPS)
    if given:
        try:
            return float(given) if float(given) > 0 else None
        except ValueError:
            return None
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in KNOWN_PEAKS.items() if key in name), None)


def tokens_of(method: str, args: tuple[Any, ...], result: Any) -> int:
    """Tokens a call processed: its batch's tokens (fwd_bwd, fwd_no_grad), the scored
    rows' tokens (log_probs), or the sampled tokens (generate); 0 for other calls."""
    if method in ("fwd_bwd", "fwd_no_grad") and args:
        return int(getattr(args[0], "num_tokens", 0) or 0)
    if method == "generate" and isinstance(result, list):
        return sum(
            len(c.get("token_ids") or ()) for out in result for c in out.get("completions", ())
        )
    if method == "log_probs" and isinstance(result, list):
        return sum(len(r.get("log_probs") or ()) for r in result if isinstance(r, dict))
    return 0


def peak_memory() -> tuple[str, float]:
    """(device, bytes): the GPU's allocated peak, else this process's peak resident set."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return "cuda", float(torch.cuda.max_memory_allocated())
    import resource

    return "cpu", float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0


def record_call(
    job_type: str,
    method: str,
    seconds: float,
    args: tuple[Any, ...],
    result: Any,
    *,
    counts_tokens: bool = True,
    parameters: int | None = None,
) -> None:
    """One engine call that returned: seconds, tokens and rate, step figures, FLOPs, MFU."""
    if not recorder.RECORDER.active():
        return
    recorder.observe(
        "arctic_rl_engine_call_duration_seconds", seconds, job_type=job_type, operation=method
    )
    device, peak = peak_memory()
    recorder.set_gauge("arctic_rl_peak_memory_bytes", peak, job_type=job_type, device=device)
    if method == "step" and isinstance(result, dict):
        recorder.inc("arctic_rl_train_steps_total", job_type=job_type)
        for name, key in (
            ("arctic_rl_train_grad_norm", "grad_norm"),
            ("arctic_rl_train_learning_rate", "lr"),
        ):
            value = result.get(key)
            if isinstance(value, int | float):
                recorder.set_gauge(name, float(value), job_type=job_type)
    if not counts_tokens:
        return
    tokens = tokens_of(method, args, result)
    if tokens <= 0:
        return
    labels = {"job_type": job_type, "operation": method}
    recorder.inc("arctic_rl_engine_tokens_total", tokens, **labels)
    if seconds > 0:
        recorder.set_gauge("arctic_rl_engine_tokens_per_second", tokens / seconds, **labels)
    per_token = FLOPS_PER_TOKEN.get(method)
    if job_type == "training" and per_token and parameters and seconds > 0:
        flops = per_token * parameters * tokens / seconds
        recorder.set_gauge("arctic_rl_train_flops_per_second", flops, **labels)
        peak_rate = peak_flops()
        if peak_rate:
            recorder.set_gauge("arctic_rl_train_mfu", flops / peak_rate, **labels)
