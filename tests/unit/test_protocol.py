"""Safetensors frames round-trip payloads; batches are validated with messages naming the row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arctic_platform.rl.protocol import (
    MAX_NESTING,
    BatchError,
    FrameError,
    decode_frame,
    encode_frame,
    validate_batch,
)


def test_frame_round_trips_ragged_lists_arrays_and_json():
    payload = {
        "job_id": 3,
        "batch": {"input_ids": [[1, 2, 3], [4]], "advantages": [0.5, -1.25]},
        "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
        "name": "x",
        "nested": [{"a": None, "b": True}],
        "inf": math.inf,
    }
    out = decode_frame(encode_frame(payload))
    assert out["batch"]["input_ids"] == [[1, 2, 3], [4]]
    assert out["batch"]["advantages"] == [0.5, -1.25]
    np.testing.assert_array_equal(out["arr"], payload["arr"])
    assert out["name"] == "x" and out["nested"] == [{"a": None, "b": True}]
    assert out["inf"] == math.inf and out["job_id"] == 3


def test_float_ragged_rows_keep_float32_values():
    out = decode_frame(encode_frame({"lp": [[-0.5, -1.5], [-2.25]]}))
    assert out["lp"] == [[-0.5, -1.5], [-2.25]]


@pytest.mark.parametrize(
    "data", [b"", b"abc", b"\xff" * 8 + b"{}", encode_frame({"a": 1})[:-3] + b"x"]
)
def test_corrupt_frames_raise_frame_error(data):
    with pytest.raises(FrameError):
        decode_frame(data)


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 900, 100_000])
def test_a_skeleton_nested_too_deeply_is_a_frame_error_not_a_recursion_error(depth):
    from safetensors.numpy import save

    skeleton = "[" * depth + "]" * depth
    frame = save({"t": np.zeros(1)}, metadata={"arctic_rl.skeleton": skeleton})
    with pytest.raises(FrameError, match="nested"):
        decode_frame(frame)


def test_a_skeleton_at_the_nesting_limit_decodes():
    value: object = 1
    for _ in range(MAX_NESTING - 1):
        value = [value]
    assert decode_frame(encode_frame({"v": value}))["v"] == value


def test_frame_without_skeleton_is_rejected():
    from safetensors.numpy import save

    with pytest.raises(FrameError, match="skeleton"):
        decode_frame(save({"t": np.zeros(2)}))


def test_validate_batch_expands_per_sequence_advantages_and_default_mask():
    b = validate_batch({"input_ids": [[1, 2, 3]], "advantages": [2.0]})
    assert b["advantages"] == [[2.0, 2.0, 2.0]]
    assert b["loss_mask"] == [[0.0, 1.0, 1.0]]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({}, "no 'input_ids'"),
        ({"input_ids": []}, "empty"),
        ({"input_ids": [[1, 2]], "loss_mask": [[1]]}, r"loss_mask\[0\] has 1 entries"),
        ({"input_ids": [[1, 2]], "advantages": [1.0, 2.0]}, "2 rows"),
        ({"input_ids": [[1, 2]], "advantages": [float("nan")]}, "NaN"),
        ({"input_ids": [[1, -2]]}, "outside the vocabulary"),
        ({"input_ids": [[1, 2.5]]}, "non-integer"),
        ({"input_ids": [[1, 2]], "loss_mask": [[0, 0]]}, "selects no token"),
        ({"input_ids": [[1, 2]], "bogus": 1}, "unknown batch field"),
        ({"input_ids": [[1, 2]], "old_log_probs": [[0.0, float("inf")]]}, "NaN or infinite"),
    ],
)
def test_bad_batches_are_rejected_with_a_message(batch, message):
    with pytest.raises(BatchError, match=message):
        validate_batch(batch)


def test_vocab_and_context_limits():
    with pytest.raises(BatchError, match="outside the vocabulary"):
        validate_batch({"input_ids": [[1, 10]]}, vocab_size=10)
    with pytest.raises(BatchError, match="context 2"):
        validate_batch({"input_ids": [[1, 2, 3]]}, max_length=2)
