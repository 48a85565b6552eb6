"""Schemathesis fuzzing of an Arctic RL http server from its own OpenAPI document.

``fuzz_server`` runs every documented operation (but the ones it is told to skip) with
schema-valid (positive) and schema-breaking (negative) requests, points a share of the
generated job ids at live jobs, and fails on any 5xx, a negative request that is accepted,
or an answer whose content type or JSON shape the document does not describe.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

EXAMPLES_ENV = "ARCTIC_RL_FUZZ_EXAMPLES"
JOB_FIELDS = ("job_id", "training_job_id")
JOB_LIST_FIELDS = ("job_ids", "sampling_job_ids", "log_prob_job_ids")


@dataclass
class FuzzReport:
    """What a fuzzing run sent and how the server answered."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)

    def record(self, operation: str, status: int) -> None:
        """Count one answered request."""
        self.requests += 1
        self.by_status[status] += 1
        self.by_operation[operation] += 1


def examples_per_mode(default: int) -> int:
    """Examples per operation and generation mode (``$ARCTIC_RL_FUZZ_EXAMPLES`` overrides)."""
    return int(os.environ.get(EXAMPLES_ENV, default))


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings of the fuzz tests: ``examples`` cases, derandomized, no deadline,
    no example database, explicit/generate/shrink phases, no health checks."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


def _retarget(case: Any, job_id: int | None) -> None:
    """Point an integer job id of ``case`` at ``job_id`` (a live job), keeping other values."""
    if job_id is None:
        return
    params = case.path_parameters
    if params and isinstance(params.get("job_id"), int):
        params["job_id"] = job_id
    body = case.body
    if isinstance(body, dict):
        for name in JOB_FIELDS:
            if isinstance(body.get(name), int) and not isinstance(body.get(name), bool):
                body[name] = job_id
        for name in JOB_LIST_FIELDS:
            if isinstance(body.get(name), list) and body[name]:
                body[name] = [job_id]


def fuzz_server(
    base_url: str,
    token: str,
    *,
    examples: int,
    live_job_ids: list[int],
    skip: frozenset[str],
    timeout: float = 120.0,
) -> FuzzReport:
    """Fuzz every operation of the server at ``base_url``; raises on the first failure."""
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
    )

    document = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(document)
    headers = {"Authorization": f"Bearer {token}"}
    checks = [
        not_a_server_error,
        negative_data_rejection,
        content_type_conformance,
        response_schema_conformance,
    ]
    report = FuzzReport()
    targets: list[int | None] = [None, *live_job_ids]
    for result in schema.get_all_operations():
        operation = result.ok()
        name = operation.definition.raw.get("operationId", operation.label)
        if name in skip:
            report.skipped.append(name)
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = _operation_test(
                operation, name, mode, examples, targets, base_url, headers, checks, timeout, report
            )
            try:
                run()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
                report.skipped.append(f"{name} (negative: nothing to break)")
    return report


def _operation_test(
    operation: Any,
    name: str,
    mode: Any,
    examples: int,
    targets: list[int | None],
    base_url: str,
    headers: dict[str, str],
    checks: list[Any],
    timeout: float,
    report: FuzzReport,
) -> Any:
    """A hypothesis test sending ``examples`` cases of ``operation`` in generation ``mode``."""
    from schemathesis.generation import GenerationMode

    @fuzz_settings(examples)
    @given(case=operation.as_strategy(generation_mode=mode), target=st.sampled_from(targets))
    def run(case: Any, target: int | None) -> None:
        if mode is GenerationMode.POSITIVE:
            _retarget(case, target)
        response = case.call(base_url=base_url, headers=headers, timeout=timeout)
        report.record(name, response.status_code)
        case.validate_response(response, checks=checks, headers=headers)

    return run
