"""The pairwise configuration matrix of the whole loop (issue 17), on real engines.

Each planned row (``bench.matrix_plan.pairwise_rows``) runs generate -> log_probs -> fwd_no_grad
-> fwd_bwd -> step -> sync -> generate, then save, a reconnecting second process that steps,
and a load, checking trainer/sampler/log-prob agreement, equal weight norms after the sync,
and a loss curve that continues across the save. The rows share one server per backend and
transport, and run two at a time, each in a process of its own. Every refused pair must be
refused at config validation naming its fields.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.clients import arctic_home

from bench.matrix_plan import KNOB_FIELDS, pairwise_rows
from bench.matrix_runner import MatrixRunner, RowResult

PLAN = pairwise_rows()


ROWS_AT_ONCE = 2  # rows run side by side, each in its own process (its own Ray driver)
GPUS = 4 * ROWS_AT_ONCE  # logical GPUs per server: room for the widest rows at once


@pytest.fixture(scope="module")
def runner(tmp_path_factory, request):
    """The selected rows, started ``ROWS_AT_ONCE`` at a time on servers started first (one
    per backend and transport); each test waits for its own row's result."""
    selected = {
        item.callspec.params["row"].id
        for item in request.session.items
        if item.originalname == "test_the_whole_loop_runs_on_the_row"
    }
    rows = [row for row in PLAN.rows if row.id in selected]
    work = tmp_path_factory.mktemp("matrix")
    results: list[RowResult] = []
    # the runner sets ARCTIC_RL_PAT for dss rows: it is put back with the home at the end
    with arctic_home(work / "home", ARCTIC_RL_PAT=os.environ.get("ARCTIC_RL_PAT")):
        with MatrixRunner(work, gpus=GPUS) as matrix:
            matrix.prepare(rows)
            with ThreadPoolExecutor(ROWS_AT_ONCE) as pool:
                futures = {row.id: pool.submit(matrix.run_in_process, row) for row in rows}
                yield futures, results
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and results:
        reporter.write_line("")
        reporter.write_line(f"configuration matrix: {len(results)} rows, {ROWS_AT_ONCE} at once")
        for r in results:
            reporter.write_line(f"  {r.row}: {'pass' if r.passed else 'FAIL'} {r.seconds} s")
        reporter.write_line(f"  in all {sum(r.seconds for r in results):.0f} s of rows")


@pytest.mark.slow
@pytest.mark.parametrize("row", PLAN.rows, ids=[row.id for row in PLAN.rows])
def test_the_whole_loop_runs_on_the_row(runner, row):
    futures, results = runner
    result = futures[row.id].result()
    results.append(result)
    assert result.passed, f"{row.id}: {result.error}\nchecks: {result.checks}"


@pytest.mark.parametrize(
    "pair", PLAN.refused_pairs, ids=[f"{a}={x}-{b}={y}" for a, x, b, y in PLAN.refused_pairs]
)
def test_a_refused_pair_is_refused_at_validation_naming_its_fields(pair):
    knob_a, _, knob_b, _ = pair
    reasons = [reason for row, reason in PLAN.refused_rows if _holds(row, pair)]
    assert reasons and all(reasons)
    for reason in reasons:
        for knob in (knob_a, knob_b):
            assert KNOB_FIELDS[knob].split(".")[-1] in reason, (knob, reason)


def _holds(row, pair) -> bool:
    knob_a, a, knob_b, b = pair
    return getattr(row, knob_a) == a and getattr(row, knob_b) == b
