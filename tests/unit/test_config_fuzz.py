"""Property tests: any config dict either validates or is a ValidationError naming a field.

Hypothesis mutates a valid ``ArcticRLClientConfig`` (and ``WeightSyncConfig``) with values of
every JSON-ish type, misspelled keys and nested ``training_config`` garbage. No input may
raise anything but pydantic's ``ValidationError``, and each of its errors must name where
it is (a field in ``loc``, or a field name in a model-level message).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from arctic_platform.rl.config import (
    ArcticRLClientConfig,
    MicroBatchSpec,
    OptimizerConfig,
    TrainingConfig,
    WeightSyncConfig,
)

BASE: dict[str, Any] = {
    "model_name": "tiny",
    "training_gpus": 1,
    "comm_protocol": "http",
    "host": "127.0.0.1",
    "port": 7000,
}
CLIENT_FIELDS = sorted(ArcticRLClientConfig.model_fields)
NESTED_FIELDS = {
    *TrainingConfig.model_fields,
    *OptimizerConfig.model_fields,
    *MicroBatchSpec.model_fields,
}
SYNC_FIELDS = sorted(WeightSyncConfig.model_fields)
EXAMPLES = 300

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["local", "http", "ray", "vllm", "deepspeed", "dss-platform", "", "0", "1"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_training_config = st.fixed_dictionaries(
    {},
    optional={
        "optimizer": st.one_of(
            _values,
            st.dictionaries(st.sampled_from(sorted(OptimizerConfig.model_fields)), _values),
        ),
        "dtype": st.one_of(_values, st.sampled_from(["fp32", "bf16", "half", "int8"])),
        "gradient_checkpointing": _values,
        "attn_impl": _values,
        "mb_spec": st.one_of(_values, st.dictionaries(st.just("max_tokens_per_mb"), _values)),
        "unknown_extra": _values,
    },
)


@st.composite
def client_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid base config with some fields replaced, dropped or misspelled."""
    data = dict(BASE)
    for name in draw(st.lists(st.sampled_from(CLIENT_FIELDS), max_size=4, unique=True)):
        if name == "training_config":
            data[name] = draw(st.one_of(_training_config, _values))
        else:
            data[name] = draw(_values)
    for name in draw(st.lists(st.sampled_from(sorted(data)), max_size=2, unique=True)):
        if draw(st.booleans()):
            data.pop(name)
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(min_size=1, max_size=10))] = draw(_values)
    return data


def _names_a_field(exc: ValidationError, known: set[str]) -> None:
    """Every error names where it is: a location, or a field in a model-level message."""
    assert exc.errors(), "a ValidationError without errors"
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if loc:
            assert loc[0] in known or err["type"] == "extra_forbidden", err
            continue
        message = err["msg"]
        assert any(name in message for name in known), f"model-level error names no field: {err}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client_configs())
def test_any_client_config_is_valid_or_a_validation_error_naming_the_field(data):
    try:
        config = ArcticRLClientConfig.model_validate(data)
    except ValidationError as exc:
        _names_a_field(exc, set(CLIENT_FIELDS) | NESTED_FIELDS)
        return
    # A valid config survives its own round trip and its /initialize payload is JSON.
    again = ArcticRLClientConfig.model_validate(config.model_dump())
    assert again == config
    payload = json.loads(json.dumps(config.initialize_payload()))
    assert payload["model_name"] == config.model_name
    for name in ("startup_timeout", "health_check_interval", "job_ready_timeout"):
        value = getattr(config, name)
        assert value > 0 and not math.isnan(value), (name, value)
    assert config.port is None or 1 <= config.port <= 65535


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(
    st.dictionaries(
        st.one_of(st.sampled_from(SYNC_FIELDS), st.text(min_size=1, max_size=8)),
        _values,
        max_size=4,
    )
)
def test_any_weight_sync_config_is_valid_or_a_validation_error_naming_the_field(data):
    try:
        sync = WeightSyncConfig.model_validate(data)
    except ValidationError as exc:
        _names_a_field(exc, set(SYNC_FIELDS))
        return
    last = sync.base_port + sync.inference_replicas * sync.inference_tp - 1
    assert 1 <= sync.base_port and last <= 65535
    assert sync.bucket_size > 0 and sync.training_gpus >= 1


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(st.dictionaries(st.text(max_size=10), _values, max_size=5))
def test_arbitrary_dicts_never_raise_anything_but_a_validation_error(data):
    try:
        ArcticRLClientConfig.model_validate(data)
    except ValidationError as exc:
        _names_a_field(exc, set(CLIENT_FIELDS) | NESTED_FIELDS | set(data))
