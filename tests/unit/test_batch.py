"""``Batch``: built once from rows or dense arrays, checked once against a job's limits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from arctic_platform.rl.batch import Batch, BatchError, BatchLimits
from arctic_platform.rl.wire import FwdBwdRequest
from arctic_platform.rl.wire.frames import decode_frame, encode_frame

ROWS = {
    "input_ids": [[11, 12, 13, 14], [21, 22], [31, 32, 33]],
    "loss_mask": [[0, 1, 1, 1], [0, 1], [0, 0, 1]],
    "old_log_probs": [[0.0, -1.0, -2.0, -3.0], [0.0, -4.0], [0.0, -5.0, -6.0]],
    "target_tokens": [[0, 12, 13, 14], [0, 22], [0, 32, 33]],
    "advantages": [0.5, -1.0, 2.0],
}
LENGTHS = [4, 2, 3]
PAD = 7  # a pad value no real entry has


def _dense(side: str, module: str = "numpy") -> dict:
    """``ROWS`` as ``[3, 5]`` arrays padded on ``side`` with ``PAD``, plus the mask."""
    width = 5
    out: dict = {}
    for name in ("input_ids", "loss_mask", "old_log_probs", "target_tokens"):
        integer = name in ("input_ids", "target_tokens")
        array = np.full((3, width), PAD, dtype=np.int64 if integer else np.float32)
        for i, row in enumerate(ROWS[name]):
            if side == "right":
                array[i, : len(row)] = row
            else:
                array[i, width - len(row) :] = row
        out[name] = array
    mask = np.zeros((3, width), dtype=np.int64)
    for i, n in enumerate(LENGTHS):
        if side == "right":
            mask[i, :n] = 1
        else:
            mask[i, width - n :] = 1
    out["attention_mask"] = mask
    out["advantages"] = np.array(ROWS["advantages"], dtype=np.float32)
    if module == "torch":
        out = {k: torch.from_numpy(v) for k, v in out.items()}
    return out


def _expected() -> dict:
    out = {k: v for k, v in ROWS.items() if k != "advantages"}
    out["advantages"] = [[a] * n for a, n in zip(ROWS["advantages"], LENGTHS, strict=True)]
    return out


def _as_lists(batch: Batch) -> dict:
    return {k: [[float(x) for x in r] for r in rows] for k, rows in batch.to_lists().items()}


def _expected_floats() -> dict:
    return {k: [[float(x) for x in r] for r in rows] for k, rows in _expected().items()}


# --- building -------------------------------------------------------------------------------


def test_rows_build_a_packed_batch_with_per_token_advantages():
    batch = Batch.build(ROWS)
    assert batch.num_rows == 3 and batch.num_tokens == 9
    assert batch.lengths.tolist() == LENGTHS
    assert _as_lists(batch) == _expected_floats()
    assert batch.flat("input_ids").dtype == np.int64
    assert batch.flat("old_log_probs").dtype == np.float32


def test_without_a_loss_mask_every_token_but_the_first_is_trained():
    batch = Batch.build({"input_ids": [[1, 2, 3], [4, 5]]})
    assert batch.to_lists()["loss_mask"] == [[0.0, 1.0, 1.0], [0.0, 1.0]]


def test_weights_are_the_loss_mask_and_giving_both_is_refused():
    batch = Batch.build({"input_ids": [[1, 2]], "weights": [[0.0, 0.5]]})
    assert batch.to_lists()["loss_mask"] == [[0.0, 0.5]] and "weights" not in batch
    with pytest.raises(BatchError, match="not both"):
        Batch.build({"input_ids": [[1, 2]], "weights": [[0, 1]], "loss_mask": [[0, 1]]})


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("module", ["numpy", "torch"])
def test_a_padded_dense_batch_with_a_mask_equals_its_rows(side, module):
    batch = Batch.build(_dense(side, module))
    assert batch.lengths.tolist() == LENGTHS
    assert _as_lists(batch) == _expected_floats()  # no pad value is left in any field


def test_a_dense_batch_without_a_mask_has_rows_of_its_full_width():
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    batch = Batch.build({"input_ids": ids, "advantages": torch.tensor([1.0, 2.0])})
    assert batch.lengths.tolist() == [3, 3]
    assert batch.to_lists()["input_ids"] == [[1, 2, 3], [4, 5, 6]]


def test_bfloat16_and_boolean_masks_are_read():
    dense = _dense("right", "torch")
    dense["old_log_probs"] = dense["old_log_probs"].to(torch.bfloat16)
    dense["attention_mask"] = dense["attention_mask"].bool()
    batch = Batch.build(dense)
    assert batch.to_lists()["old_log_probs"][1] == [0.0, -4.0]


def test_rows_given_as_arrays_are_read():
    rows = [np.array(r) for r in ROWS["input_ids"]]
    batch = Batch.build({"input_ids": rows, "advantages": np.array([1.0, 1.0, 1.0])})
    assert batch.to_lists()["input_ids"] == ROWS["input_ids"]


def test_per_token_advantages_and_mixed_rows():
    batch = Batch.build({"input_ids": [[1, 2], [3, 4, 5]], "advantages": [[0.5, 1.5], 2.0]})
    assert batch.to_lists()["advantages"] == [[0.5, 1.5], [2.0, 2.0, 2.0]]


# --- reading --------------------------------------------------------------------------------


def test_padded_right_pads_the_chosen_rows():
    batch = Batch.build(ROWS)
    out = batch.padded("input_ids", [1, 0], 5, -1)
    assert out.tolist() == [[21, 22, -1, -1, -1], [11, 12, 13, 14, -1]]
    assert batch.padded("old_log_probs", [2], 3, 0.0).dtype == np.float32


def test_select_keeps_rows_in_order_and_the_checked_limits():
    limits = BatchLimits(vocab_size=100, max_length=10)
    batch = Batch.build(ROWS, limits=limits)
    part = batch.select([2, 0])
    assert part.to_lists()["input_ids"] == [ROWS["input_ids"][2], ROWS["input_ids"][0]]
    assert part.checked == limits


def test_to_padded_builds_back_the_same_batch():
    batch = Batch.build(ROWS)
    again = Batch.build(batch.to_padded())
    assert _as_lists(again) == _as_lists(batch)


def test_a_batch_pickles_as_it_is():
    batch = Batch.build(ROWS, limits=BatchLimits(vocab_size=100))
    again = pickle.loads(pickle.dumps(batch))
    assert _as_lists(again) == _as_lists(batch) and again.checked == batch.checked


def test_a_dense_batch_travels_in_a_frame_and_a_batch_is_encoded_dense():
    decoded = decode_frame(encode_frame({"batch": _dense("left", "torch")}))
    assert _as_lists(Batch.build(decoded["batch"])) == _expected_floats()
    sent = decode_frame(encode_frame({"batch": Batch.build(ROWS)}))["batch"]
    assert isinstance(sent["input_ids"], np.ndarray) and "attention_mask" in sent
    assert _as_lists(Batch.build(sent)) == _expected_floats()


def test_the_request_model_builds_the_batch_and_names_the_field_when_it_cannot():
    request = FwdBwdRequest.model_validate({"job_id": 1, "batch": _dense("right")})
    assert isinstance(request.batch, Batch) and request.batch.num_rows == 3
    built = Batch.build(ROWS)
    assert FwdBwdRequest(job_id=1, batch=built).batch is built  # never built twice
    with pytest.raises(ValueError, match=r"batch[\s\S]*input_ids\[1\]"):
        FwdBwdRequest.model_validate({"job_id": 1, "batch": {"input_ids": [[1], [2.5]]}})


# --- refusals -------------------------------------------------------------------------------


def _with(**changes) -> dict:
    dense = _dense("right")
    dense.update(changes)
    return dense


BAD = {
    "float token ids": (_with(input_ids=np.ones((3, 5), dtype=np.float32)), "input_ids"),
    "a mask of another shape": (_with(attention_mask=np.ones((3, 4))), "attention_mask"),
    "a mask with a hole": (
        _with(attention_mask=np.array([[1, 0, 1, 0, 0], [1, 1, 0, 0, 0], [1] * 5])),
        r"attention_mask\[0\]",
    ),
    "a mask that is not 0/1": (_with(attention_mask=np.full((3, 5), 2)), "attention_mask"),
    "an all-zero mask row": (
        _with(attention_mask=np.array([[1] * 5, [0] * 5, [1] * 5])),
        r"input_ids\[1\]",
    ),
    "a per-token field of another shape": (
        _with(old_log_probs=np.zeros((3, 4), dtype=np.float32)),
        "old_log_probs",
    ),
    "float target tokens": (
        _with(target_tokens=np.zeros((3, 5), dtype=np.float32)),
        "target_tokens",
    ),
    "string log-probs": (_with(old_log_probs=np.full((3, 5), "x")), "old_log_probs"),
    "NaN in a padded field's real part": (
        _with(old_log_probs=np.full((3, 5), np.nan, dtype=np.float32)),
        r"old_log_probs\[0\]",
    ),
    "per-sequence advantages of the wrong count": (
        _with(advantages=np.ones(2)),
        "'advantages' has 2 rows",
    ),
    "one-dimensional input_ids": ({"input_ids": np.arange(4)}, "input_ids"),
    "three-dimensional input_ids": ({"input_ids": np.zeros((2, 2, 2), dtype=int)}, "input_ids"),
    "a mask with ragged rows": (
        {"input_ids": [[1, 2], [3]], "attention_mask": np.ones((2, 2))},
        "attention_mask",
    ),
    "a boolean token": ({"input_ids": [[1, True]]}, r"input_ids\[0\].*non-integer"),
    "a string token": ({"input_ids": [[1, 2], ["a"]]}, r"input_ids\[1\].*non-integer"),
    "a negative token": ({"input_ids": [[1, -2]]}, r"input_ids\[0\].*vocabulary"),
    "a token past 64 bits": ({"input_ids": [[1, 2**70]]}, r"input_ids\[0\].*vocabulary"),
    "a row that is a number": ({"input_ids": [[1, 2], 3]}, r"input_ids\[1\]"),
    "rows nested a level too deep": (
        {"input_ids": [[1, 2]], "loss_mask": [np.array([0.0, 1.0]), [[1], [2, 3]]]},
        "'loss_mask' has 2 rows",
    ),
    "a nested row beside an array row": (
        {"input_ids": [[1, 2], [3, 4]], "loss_mask": [np.array([0.0, 1.0]), [[1], [2, 3]]]},
        r"loss_mask\[1\] holds \[1\]",
    ),
    "a mask of scalar arrays": (
        {"input_ids": [[1, 2], [3, 4]], "attention_mask": [np.array(1), np.array(0)]},
        "attention_mask",
    ),
    "a ragged loss_mask": (
        {"input_ids": [[1, 2, 3], [4, 5]], "loss_mask": [[0, 1, 1], [0, 1, 1]]},
        r"loss_mask\[1\] has 3 entries",
    ),
    "a float32 overflow": ({"input_ids": [[1, 2]], "old_log_probs": [[0, 1e39]]}, "infinite"),
    "a dict that is a list": ([[1, 2]], "dict of fields"),
    "an unknown field": ({"input_ids": [[1, 2]], "rewards": [1.0]}, "rewards"),
    "no input_ids": ({"loss_mask": [[0, 1]]}, "no 'input_ids'"),
    "an empty dense batch": ({"input_ids": np.zeros((0, 4), dtype=int)}, "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_batch_is_a_value_error_naming_the_field(case):
    data, message = BAD[case]
    with pytest.raises(ValueError, match=message) as info:
        Batch.build(data)
    assert isinstance(info.value, BatchError)


# --- limits ---------------------------------------------------------------------------------


def test_token_ids_are_checked_against_the_vocabulary():
    with pytest.raises(BatchError, match=r"input_ids\[2\] holds token id 33 .*\[0, 33\)"):
        Batch.build(ROWS, limits=BatchLimits(vocab_size=33))
    with pytest.raises(BatchError, match=r"target_tokens\[2\].*\[0, 33\)"):
        Batch.build({**ROWS, "input_ids": [[1] * 4, [1] * 2, [1] * 3]}, limits=BatchLimits(33))


def test_rows_are_checked_against_the_context():
    with pytest.raises(BatchError, match=r"input_ids\[0\] has 4 tokens, more than .* context 3"):
        Batch.build(_dense("left"), limits=BatchLimits(max_length=3))


def test_a_batch_is_checked_once_per_limits_and_again_for_other_limits():
    wide = BatchLimits(vocab_size=100, max_length=100)
    batch = Batch.build(ROWS, limits=wide)
    assert batch.checked == wide
    assert Batch.build(batch, limits=wide) is batch  # a Batch is never rebuilt
    with pytest.raises(BatchError, match="vocabulary"):
        batch.check(BatchLimits(vocab_size=20))
    assert batch.checked == wide


def test_padded_rows_given_as_lists_with_a_mask_are_read_as_dense():
    dense = {k: v.tolist() for k, v in _dense("left").items()}  # a tokenizer's padded lists
    assert _as_lists(Batch.build(dense)) == _expected_floats()
    with pytest.raises(BatchError, match="attention_mask"):
        Batch.build({"input_ids": [[1, 2], [3]], "attention_mask": [[1, 1], [1]]})
