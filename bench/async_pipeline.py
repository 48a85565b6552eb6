"""The demo synchronous vs ``--async`` (one-step off-policy), in one run: RL steps/s and accuracy.

Runs ``arctic-rl demo`` twice with the same settings and seed, each in a fresh process: once
synchronous, once with ``--async``. Reports RL steps per second (the steps' own wall time;
held-out evaluations are left out of it, and run only after SFT and at the end here, so
background generation cannot run ahead during them), the ratio async / sync (goal >= 1.3),
and both runs' ``heldout_exact_final`` (goal: within 0.05). ``python -m bench.async_pipeline``
also rewrites its own section of ``bench/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN = "<!-- async-pipeline:begin (python -m bench.async_pipeline) -->"
END = "<!-- async-pipeline:end -->"


def _demo(out: Path, async_mode: bool, extra: list[str]) -> dict[str, Any]:
    """One demo run in a fresh interpreter; its ``summary.json``."""
    args = [sys.executable, "-m", "arctic_platform.rl.cli", "demo", "--quiet"]
    args += ["--output-dir", str(out), "--eval-every", "0", *extra]
    if async_mode:
        args.append("--async")
    env = dict(os.environ, ARCTIC_RL_HOME=str(out / "home"), HF_HUB_OFFLINE="1")
    done = subprocess.run(args, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"demo {'--async' if async_mode else 'sync'} failed:\n{done.stderr[-3000:]}"
        )
    return dict(json.loads((out / "summary.json").read_text()))


def run(steps: int | None = None, extra: list[str] | None = None) -> dict[str, Any]:
    """Run both modes (sync first) and return their summaries and the comparison."""
    flags = list(extra or [])
    if steps is not None:
        flags += ["--steps", str(steps)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        sync = _demo(Path(tmp) / "sync", False, flags)
        asyn = _demo(Path(tmp) / "async", True, flags)
    keep = (
        "rl_steps_per_second",
        "rl_step_seconds",
        "heldout_exact_after_sft",
        "heldout_exact_final",
        "staleness_max",
        "staleness_mean",
        "total_seconds",
        "mean_step_seconds_by_phase",
    )
    return {
        "flags": flags,
        "steps": sync["steps"],
        "sync": {k: sync[k] for k in keep},
        "async": {k: asyn[k] for k in keep},
        "speedup": asyn["rl_steps_per_second"] / sync["rl_steps_per_second"],
        "heldout_final_difference": asyn["heldout_exact_final"] - sync["heldout_exact_final"],
        "seconds": time.monotonic() - started,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    s, a = report["sync"], report["async"]
    return [
        (
            f"demo RL steps/s, --async (staleness <= {a['staleness_max']}) vs sync "
            f"({report['steps']} GRPO steps)",
            f"{a['rl_steps_per_second']:.3f} vs {s['rl_steps_per_second']:.3f} steps/s",
            f"{report['speedup']:.2f}",
        ),
        (
            "demo heldout_exact_final, --async vs sync",
            f"{a['heldout_exact_final']:.3f} vs {s['heldout_exact_final']:.3f} "
            f"(after SFT {a['heldout_exact_after_sft']:.3f} / {s['heldout_exact_after_sft']:.3f})",
            f"{report['heldout_final_difference']:+.3f}",
        ),
    ]


def write_section(report: dict[str, Any], path: Path = HERE / "results.md") -> None:
    """Replace (or append) this benchmark's own section of ``results.md``."""
    s, a = report["sync"], report["async"]
    phases = " / ".join(
        f"{name} {sec:.3f} s" for name, sec in a["mean_step_seconds_by_phase"].items()
    )
    sync_phases = " / ".join(
        f"{name} {sec:.3f} s" for name, sec in s["mean_step_seconds_by_phase"].items()
    )
    flags = " ".join(report["flags"]) or "defaults"
    body = [
        BEGIN,
        "",
        "## Async pipeline (demo sync vs `--async`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on the 2-core CPU machine (shared with other "
        f"work), `python -m bench.async_pipeline` (flags: `{flags}`, evaluations only after "
        "SFT and at the end): the same demo and seed, synchronous "
        "then `--async`, each in a fresh process. Goals: ratio >= 1.3, final held-out exact "
        "match within 0.05.",
        "",
        "| benchmark | measured | ratio |",
        "|---|---|---|",
        *[f"| {x} | {y} | {z} |" for x, y, z in rows(report)],
        "",
        f"Mean step, sync: {sync_phases}.",
        f"Mean step, async: {phases}.",
        "",
        END,
    ]
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + "\n".join(body) + tail
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="GRPO steps (default: the demo's)")
    parser.add_argument("--no-write", action="store_true", help="leave bench/results.md as is")
    args, extra = parser.parse_known_args(argv)
    report = run(steps=args.steps, extra=extra)
    print(json.dumps(report, indent=2))
    for row in rows(report):
        print(" | ".join(row))
    if not args.no_write:
        write_section(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
