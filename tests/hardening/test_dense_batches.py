"""A dense padded batch through the real http transport does what its rows do.

The client sends numpy or torch ``[batch, seq]`` arrays with an ``attention_mask`` (right- or
left-padded) in a safetensors frame; the server builds one ``Batch`` from them. Loss,
per-token log-probs and the gradient (the next step's norm) must equal the list form's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow

ROWS = [[1, 5, 6, 7, 8, 9], [1, 5, 6], [1, 7, 8, 9, 10]]
MASKS = [[0, 0, 1, 1, 1, 1], [0, 0, 1], [0, 0, 1, 1, 1]]
OLD = [[0.0, -2.0, -2.1, -2.2, -2.3, -2.4], [0.0, -1.0, -1.5], [0.0, -3.0, -3.1, -3.2, -3.3]]
ADVANTAGES = [1.0, -0.5, 0.25]
PAD_ID, PAD_VALUE = 0, 9.0  # padding must never reach the model or the loss
TINY_LR = 1e-30  # a real step whose update is far below float32's resolution


def rows_batch() -> dict[str, Any]:
    """The batch as lists of rows (the wire format every client had so far)."""
    return {
        "input_ids": ROWS,
        "loss_mask": MASKS,
        "old_log_probs": OLD,
        "advantages": ADVANTAGES,
    }


def dense_batch(side: str, as_torch: bool) -> dict[str, Any]:
    """The same batch as ``[3, 8]`` arrays padded on ``side``, with an attention mask."""
    width = 8
    ids = np.full((3, width), PAD_ID, dtype=np.int64)
    mask = np.zeros((3, width), dtype=np.int64)
    loss = np.full((3, width), PAD_VALUE, dtype=np.float32)
    old = np.full((3, width), PAD_VALUE, dtype=np.float32)
    for i, row in enumerate(ROWS):
        cut = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, cut], mask[i, cut], loss[i, cut], old[i, cut] = row, 1, MASKS[i], OLD[i]
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "loss_mask": loss,
        "old_log_probs": old,
        "advantages": np.array(ADVANTAGES, dtype=np.float32),
    }
    return {k: torch.from_numpy(v) for k, v in out.items()} if as_torch else out


FORMS = {
    "right-padded numpy": lambda: dense_batch("right", as_torch=False),
    "left-padded numpy": lambda: dense_batch("left", as_torch=False),
    "right-padded torch": lambda: dense_batch("right", as_torch=True),
    "left-padded torch": lambda: dense_batch("left", as_torch=True),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_dense_batch_gives_the_loss_and_log_probs_of_its_rows(live, form):
    client = live.client
    expected = client.fwd_bwd(rows_batch(), "grpo", forward_only=True, return_log_probs=True)
    got = client.fwd_bwd(FORMS[form](), "grpo", forward_only=True, return_log_probs=True)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6, abs=1e-9)
    assert got["tokens"] == expected["tokens"] == sum(map(sum, MASKS))
    assert [len(r) for r in got["log_probs"]] == [len(r) for r in ROWS]
    for mine, theirs in zip(got["log_probs"], expected["log_probs"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-6)


def test_a_dense_batch_accumulates_the_gradient_of_its_rows(live):
    client = live.client
    norms = client.weight_norm()
    from_rows = client.fwd_bwd(rows_batch(), "grpo")
    step_rows = client.step(learning_rate=TINY_LR)
    from_dense = client.fwd_bwd(dense_batch("left", as_torch=True), "grpo")
    step_dense = client.step(learning_rate=TINY_LR)
    assert step_rows["applied"] and step_dense["applied"]
    assert from_dense["loss"] == pytest.approx(from_rows["loss"], rel=1e-6, abs=1e-9)
    assert step_rows["grad_norm"] > 0
    assert step_dense["grad_norm"] == pytest.approx(step_rows["grad_norm"], rel=1e-5)
    assert client.weight_norm() == norms  # the tiny rate moved no weight
    live.assert_healthy()


def test_a_dense_batch_over_the_context_or_vocabulary_is_a_422_naming_the_row(live):
    from arctic_platform.rl.errors import ServerError

    batch = dense_batch("right", as_torch=False)
    batch["input_ids"][2, 3] = 10**6
    with pytest.raises(ServerError) as info:
        live.client.fwd_bwd(batch, "grpo")
    assert info.value.status_code == 422
    assert "input_ids[2]" in info.value.message and "vocabulary" in info.value.message
    live.assert_healthy()
