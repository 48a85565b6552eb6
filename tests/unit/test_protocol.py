"""Safetensors frames round-trip payloads; batches are validated with messages naming the row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arctic_platform.rl.batch import BatchError
from arctic_platform.rl.wire.frames import (
    MAX_NESTING,
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


# --- the frame format exactly (each test kills mutants the tests above let through) ---------


def _skeleton(frame: bytes) -> object:
    import json

    size = int.from_bytes(frame[:8], "little")
    return json.loads(json.loads(frame[8 : 8 + size])["__metadata__"]["arctic_rl.skeleton"])


def _frame(skeleton: object, tensors: dict | None = None) -> bytes:
    import json

    from safetensors.numpy import save

    return save(tensors or {}, metadata={"arctic_rl.skeleton": json.dumps(skeleton)})


def _frame_error(data: bytes) -> str:
    with pytest.raises(FrameError) as info:
        decode_frame(data)
    return str(info.value)


def test_numeric_rows_travel_as_one_ragged_tensor_pair_and_other_lists_as_json():
    frame = encode_frame({"ids": [[1, 2], [], [3]], "words": [["a", "b"], ["c"]], "f": [[True]]})
    assert _skeleton(frame) == {
        "ids": {"__ragged__": ["t0", "t1"]},
        "words": [["a", "b"], ["c"]],
        "f": [[True]],
    }
    out = decode_frame(frame)
    assert out == {"ids": [[1, 2], [], [3]], "words": [["a", "b"], ["c"]], "f": [[True]]}
    assert decode_frame(encode_frame({"e": []})) == {"e": []}


def test_float_rows_are_sent_as_float32_and_int_rows_as_int64():
    frame = encode_frame({"x": [[0.1, 2], [3]], "n": [[2**40]]})
    assert decode_frame(frame)["x"] == [[float(np.float32(0.1)), 2.0], [3.0]]
    arrays = decode_frame(frame, as_lists=False)
    assert [a.dtype for a in arrays["x"]] == [np.float32, np.float32]
    assert arrays["n"][0].dtype == np.int64 and arrays["n"][0].tolist() == [2**40]
    assert isinstance(arrays["x"][0], np.ndarray)


def test_only_non_finite_floats_are_spelled_out_in_the_skeleton():
    frame = encode_frame({"a": 0.5, "b": -math.inf, "c": math.nan})
    assert _skeleton(frame) == {"a": 0.5, "b": {"__float__": "-inf"}, "c": {"__float__": "nan"}}


def test_torch_tensors_travel_as_arrays_and_bfloat16_says_so():
    torch = pytest.importorskip("torch")
    w = torch.tensor([[1.0, 2.5]], requires_grad=True)
    b = torch.tensor([0.5, -1.0], dtype=torch.bfloat16)
    frame = encode_frame({"w": w, "b": b, "i": torch.tensor([3, 4])})
    assert _skeleton(frame) == {
        "w": {"__tensor__": "t0"},
        "b": {"__tensor__": "t1", "dtype": "bfloat16"},
        "i": {"__tensor__": "t2"},
    }
    out = decode_frame(frame)
    np.testing.assert_array_equal(out["w"], np.array([[1.0, 2.5]], dtype=np.float32))
    assert out["b"].dtype == np.float32 and out["b"].tolist() == [0.5, -1.0]
    assert out["i"].dtype == np.int64 and out["i"].tolist() == [3, 4]


def test_a_scalar_payload_round_trips():
    assert decode_frame(encode_frame(5)) == 5 and decode_frame(encode_frame("x")) == "x"


def test_a_skeleton_of_dicts_nested_too_deeply_is_refused():
    value: object = 1
    for _ in range(MAX_NESTING + 1):
        value = {"k": value}
    assert (
        _frame_error(_frame(value)) == f"frame skeleton is nested deeper than {MAX_NESTING} levels"
    )


def test_frames_too_short_or_with_a_header_past_the_end_say_so():
    assert _frame_error(b"\x00" * 7) == "frame of 7 bytes is too short to be a safetensors frame"
    assert _frame_error(b"\x00" * 8).startswith("frame is not valid safetensors: ")
    header_past_end = (5).to_bytes(8, "little") + b"{}{}"
    assert _frame_error(header_past_end) == (
        "frame header length exceeds the frame size (truncated or corrupt)"
    )
    header_at_end = (4).to_bytes(8, "little") + b"{}{}"
    assert _frame_error(header_at_end).startswith("frame is not valid safetensors: ")


def test_a_deeply_nested_header_is_a_frame_error():
    header = b"[" * 100_000 + b"]" * 100_000
    data = len(header).to_bytes(8, "little") + header
    assert _frame_error(data) == "frame header is nested too deeply to be read"


def test_a_skeleton_that_is_not_json_says_so():
    from safetensors.numpy import save

    frame = save({}, metadata={"arctic_rl.skeleton": "{nope"})
    assert _frame_error(frame).startswith("frame skeleton is not JSON: ")


@pytest.mark.parametrize("key", ["t9", 3])
def test_a_skeleton_naming_a_missing_tensor_is_refused(key):
    frame = _frame({"x": {"__tensor__": key}}, {"t0": np.zeros(1)})
    assert _frame_error(frame) == f"frame skeleton refers to a missing tensor {key!r}"


@pytest.mark.parametrize(
    "lengths",
    [
        np.array([1, 1], dtype=np.int64),  # sums to 2, the data holds 3
        np.array([[3]], dtype=np.int64),  # not one length per row
        np.array([4, -1], dtype=np.int64),  # sums right, but a row of -1
    ],
)
def test_ragged_lengths_that_do_not_fit_the_data_are_refused(lengths):
    frame = _frame({"r": {"__ragged__": ["f", "n"]}}, {"f": np.arange(3), "n": lengths})
    assert _frame_error(frame) == "ragged tensor lengths do not match its data"


def test_a_ragged_tensor_of_no_rows_is_an_empty_list():
    frame = _frame(
        {"r": {"__ragged__": ["f", "n"]}}, {"f": np.zeros(0), "n": np.zeros(0, np.int64)}
    )
    assert decode_frame(frame) == {"r": []}


def test_a_batch_travels_dense_as_its_padded_arrays():
    from arctic_platform.rl.batch import Batch

    batch = Batch.build({"input_ids": [[1, 2, 3], [4]], "advantages": [0.5, -1.0]})
    out = decode_frame(encode_frame({"batch": batch}), as_lists=False)["batch"]
    padded = batch.to_padded()
    assert set(out) == set(padded)
    for name, array in padded.items():
        np.testing.assert_array_equal(out[name], array)
    np.testing.assert_array_equal(out["attention_mask"], [[1, 1, 1], [1, 0, 0]])
