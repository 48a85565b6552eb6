"""The demos' view of the sampler/trainer mismatch of their GRPO steps: each step's figures for
the metrics file, a plot panel (k3 and the ratio's range, under the reward curves) and the
summary's figures."""

from __future__ import annotations

import math
from typing import Any


def mismatch_record(metrics: dict[str, Any]) -> dict[str, float | None]:
    """A GRPO step's sampler/trainer mismatch for the metrics file (None: not measured)."""
    names = {
        "mismatch_k1": "mismatch_k1",
        "mismatch_k3": "mismatch_k3",
        "mismatch_ratio_min": "mismatch_ratio.min",
        "mismatch_ratio_max": "mismatch_ratio.max",
        "rollout_is_ess": "rollout_is_ess",
    }
    return {
        key: (float(metrics[name]) if metrics.get(name) is not None else None)
        for key, name in names.items()
    }


def _largest_log_ratio(record: dict[str, Any]) -> float | None:
    low, high = record.get("mismatch_ratio_min"), record.get("mismatch_ratio_max")
    if not low or not high or low <= 0 or high <= 0:
        return None
    return max(abs(math.log(low)), abs(math.log(high)))


def mismatch_summary(rl: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean and largest k3 over the GRPO steps that measured it, the largest |log ratio| of
    any token, and the smallest effective sample size of the correction weights."""
    k3 = [float(r["mismatch_k3"]) for r in rl if r.get("mismatch_k3") is not None]
    gaps = [g for g in map(_largest_log_ratio, rl) if g is not None]
    ess = [float(r["rollout_is_ess"]) for r in rl if r.get("rollout_is_ess") is not None]
    return {
        "mismatch_k3_mean": sum(k3) / len(k3) if k3 else None,
        "mismatch_k3_max": max(k3, default=None),
        "mismatch_max_abs_log_ratio": max(gaps, default=None),
        "rollout_is_ess_min": min(ess, default=None),
    }


def mismatch_rows(summary: dict[str, Any]) -> list[str]:
    """The summary table's mismatch rows (none when no step measured it)."""
    if summary.get("mismatch_k3_mean") is None:
        return []
    rows = [
        f"| sampler/trainer mismatch k3, mean / max over GRPO steps | "
        f"{summary['mismatch_k3_mean']:.2e} / {summary['mismatch_k3_max']:.2e} |",
        f"| largest token \\|log ratio\\| (trainer/sampler) | "
        f"{summary['mismatch_max_abs_log_ratio'] or 0.0:.3f} |",
    ]
    if summary.get("rollout_is_ess_min") is not None:
        rows.append(
            f"| smallest effective sample size of the correction weights | "
            f"{summary['rollout_is_ess_min']:.3f} |"
        )
    return rows


def draw_mismatch(ax: Any, xs: list[float], rl: list[dict[str, Any]]) -> None:
    """k3 (KL(sampler||trainer)) per step on a log axis, and the largest |log ratio| on a
    second axis; steps that measured nothing are left out."""
    k3 = [(x, r.get("mismatch_k3")) for x, r in zip(xs, rl, strict=True)]
    k3 = [(x, max(v, 1e-12)) for x, v in k3 if v is not None]
    if k3:
        ax.semilogy(*zip(*k3, strict=True), color="tab:red", label="mismatch k3 (left)")
    gaps = [(x, g) for x, g in zip(xs, map(_largest_log_ratio, rl), strict=True) if g is not None]
    ax.set_ylabel("k3 (nats)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if gaps:
        right = ax.twinx()
        right.plot(
            *zip(*gaps, strict=True), color="tab:purple", alpha=0.6, label="max |log ratio| (right)"
        )
        right.set_ylabel("max |log ratio|")
        more, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more, labels + more_labels
    if handles:
        ax.legend(handles, labels, loc="upper right", fontsize="small")
    ax.set_title("sampler/trainer mismatch per GRPO step", fontsize="small")
