"""The configuration matrix's plan: pairwise coverage of the supported rows, and refusals."""

from __future__ import annotations

import itertools

import pytest

from bench.matrix_plan import KNOBS, Row, _pairs, pairwise_rows, refusal, supported_rows


@pytest.fixture(scope="module")
def plan():
    return pairwise_rows()


def test_every_pair_a_supported_row_can_hold_meets_in_a_planned_row(plan):
    need = set()
    for row in supported_rows():
        need.update(_pairs(row.values()))
    covered = set()
    for row in plan.rows:
        covered.update(_pairs(row.values()))
    assert need <= covered
    assert all(refusal(row) is None for row in plan.rows)


def test_the_plan_is_far_smaller_than_the_product(plan):
    product = 1
    for values in KNOBS.values():
        product *= len(values)
    assert len(plan.rows) <= 12 < product


def test_every_pair_is_either_covered_or_refused_by_validation_naming_both_fields(plan):
    names = list(KNOBS)
    covered = set()
    for row in plan.rows:
        covered.update(_pairs(row.values()))
    refused = {(names.index(a), x, names.index(b), y) for a, x, b, y in plan.refused_pairs}
    for i, j in itertools.combinations(range(len(names)), 2):
        for a in KNOBS[names[i]]:
            for b in KNOBS[names[j]]:
                assert ((i, a, j, b) in covered) != ((i, a, j, b) in refused)
    for row, reason in plan.refused_rows:
        assert reason, f"{row.id} was expected to be refused"


def test_dss_platform_over_ray_is_refused_naming_backend_and_comm_protocol():
    reason = refusal(Row(backend="dss-platform", transport="ray"))
    assert reason is not None
    assert "backend='dss-platform'" in reason and "comm_protocol='ray'" in reason
    assert refusal(Row(backend="dss-platform", transport="http")) is None


def test_row_ids_are_unique_and_name_every_knob(plan):
    ids = [row.id for row in plan.rows]
    assert len(set(ids)) == len(ids)
    assert all(len(i.split("-")) >= len(KNOBS) for i in ids)
