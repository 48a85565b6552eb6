"""``python -m bench``: run every benchmark, one process each, and write a markdown table.

Each benchmark reports a ratio against the direct use of the same engine in the same run.
Results go to ``bench/results.md`` (table) and ``bench/results.json`` (everything).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "sampling_engine": {},
    "training_engine": {},
    "transport": {"transports": ("http", "ray")},
    "weight_sync": {},
    "load": {},
    "tinker": {},
    "lora_sync": {},
    "tinker_models": {},
    "agent_sessions": {},
    "mismatch": {},
    "metrics_overhead": {},
    "demo_correction": {},  # five demo runs, about 8 minutes
    "soak": {"steps": 2000, "every": 50},  # about 13 minutes on the 2-core machine
}


def _run_one(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``bench.<name>.run(**kwargs)`` in a fresh interpreter (engines leave state behind)."""
    program = (
        "import json, sys\n"
        f"from bench import {name} as m\n"
        f"r = m.run(**{kwargs!r})\n"
        "print('\\nBENCH-JSON ' + json.dumps(r))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    for line in done.stdout.splitlines():
        if line.startswith("BENCH-JSON "):
            return json.loads(line[len("BENCH-JSON ") :])
    raise RuntimeError(f"benchmark {name} failed:\n{done.stderr[-3000:]}")


def _demo_rows(summary_path: Path) -> list[tuple[str, str, str]]:
    summary = json.loads(summary_path.read_text())
    phases = summary["mean_step_seconds_by_phase"]
    total = phases.get("total") or sum(phases.values())
    return [
        (f"demo step: {name}", f"{sec:.3f} s", f"{sec / total:.2f} of the step")
        for name, sec in phases.items()
        if name != "total"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--demo-summary", help="a demo run's summary.json for the breakdown")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    results: dict[str, Any] = {}
    table: list[tuple[str, str, str]] = []
    for name in names:
        started = time.monotonic()
        print(f"== {name}", file=sys.stderr, flush=True)
        results[name] = _run_one(name, BENCHMARKS[name])
        module = importlib.import_module(f"bench.{name}")
        table.extend(module.rows(results[name]))
        print(f"   done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.demo_summary:
        table.extend(_demo_rows(Path(args.demo_summary)))
    lines = ["| benchmark | measured | ratio |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in table]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    (HERE / "results.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
