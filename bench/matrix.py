"""The configuration matrix of the whole loop: pairwise rows for CI, the full product on demand.

The plan (the twelve knobs, a row's config, refusals, the pairwise covering array) is in
``bench.matrix_plan``; the runner (the whole loop on one row, servers shared by rows) in
``bench.matrix_runner``. This module is the command line, and keeps their names importable.

``python -m bench.matrix`` runs the pairwise rows; ``--full`` the full product; each writes a
table of pass/fail and seconds per row (``--out``, default ``bench/matrix_results.md``).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from bench.matrix_plan import (  # noqa: F401 (re-exported: the matrix's names before the split)
    KNOB_FIELDS,
    KNOBS,
    PLAN_SEED,
    Plan,
    Row,
    full_product,
    pairwise_rows,
    refusal,
    row_config,
    search_seed,
    supported_rows,
)
from bench.matrix_runner import MatrixRunner, RowFailure, RowResult  # noqa: F401

HERE = Path(__file__).resolve().parent


def _table(results: list[RowResult], title: str) -> str:
    lines = [f"## {title}", "", "| row | result | seconds | detail |", "|---|---|---|---|"]
    for r in results:
        detail = r.error.replace("|", "/").replace("\n", " ")[:300] if r.error else ""
        if r.passed:
            keys = ("step0_vs_sampler", "synced_vs_sampler", "synced_vs_log_prob")
            detail = ", ".join(f"{k}={r.checks[k]:.2g}" for k in keys if k in r.checks)
        lines.append(f"| {r.row} | {'pass' if r.passed else 'FAIL'} | {r.seconds} | {detail} |")
    passed = sum(r.passed for r in results)
    total = sum(r.seconds for r in results)
    lines += ["", f"{passed}/{len(results)} rows passed, {total:.0f} s in all.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the pairwise rows (or ``--full``) and write the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.matrix", description=__doc__)
    parser.add_argument("--full", action="store_true", help="the full product of the knobs")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many rows")
    parser.add_argument("--plan", action="store_true", help="print the rows and exit")
    parser.add_argument("--search-seed", action="store_true", help="find PLAN_SEED and exit")
    parser.add_argument("--out", type=Path, default=HERE / "matrix_results.md")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.search_seed:
        seed, size = search_seed()
        print(f"seed {seed} gives {size} rows")
        return 0
    plan = pairwise_rows()
    rows = list(supported_rows()) if args.full else plan.rows
    if args.limit is not None:
        rows = rows[: args.limit]
    if args.plan:
        for row in rows:
            print(row.id)
        for pair in plan.refused_pairs:
            print("refused pair:", pair)
        return 0
    import tempfile

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="arctic-matrix-"))
    os.environ.setdefault("ARCTIC_RL_HOME", str(work / "home"))
    results: list[RowResult] = []
    title = "full product" if args.full else "pairwise rows"
    with MatrixRunner(work) as runner:
        for n, row in enumerate(rows, 1):
            result = runner.run(row)
            results.append(result)
            print(
                f"[{n}/{len(rows)}] {row.id}: {'pass' if result.passed else 'FAIL'} "
                f"{result.seconds}s {result.error[:200]}",
                flush=True,
            )
            args.out.write_text(_table(results, title))
    (args.out.with_suffix(".json")).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
