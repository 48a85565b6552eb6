"""group_advantages and rollout_batch: generate's answer to a training batch with the sampler's
log-probs as rollout_log_probs, checked by hand on a small answer."""

from __future__ import annotations

import pytest

from arctic_platform.rl import group_advantages, rollout_batch
from arctic_platform.rl.batch import Batch
from arctic_platform.rl.errors import InvalidRequestError

ANSWER = {
    "outputs": [
        {
            "prompt_token_ids": [5, 6],
            "completions": [
                {"text": "a", "token_ids": [7, 8], "logprobs": [-0.5, -0.25]},
                {"text": "b", "token_ids": [9], "logprobs": [-1.0]},
            ],
        },
        {
            "prompt_token_ids": [4],
            "completions": [
                {"text": "c", "token_ids": [3, 2, 1], "logprobs": [-0.1, -0.2, -0.3]},
                {"text": "d", "token_ids": [1], "logprobs": [-2.0]},
            ],
        },
    ],
    "completion_tokens": 7,
}


def test_group_advantages_centre_and_scale_each_group_and_zero_a_tied_one():
    assert group_advantages([1.0, 0.0, 0.5, 0.5], 2) == pytest.approx([1.0, -1.0, 0.0, 0.0], 1e-5)
    assert group_advantages([3.0, 1.0], 2, scale=False) == [1.0, -1.0]
    assert group_advantages([1, 2, 3], 3, eps=0.0) == pytest.approx([-1.2247449, 0.0, 1.2247449])
    for rewards, size in (([1.0, 2.0], 3), ([1.0], 0), ([float("nan"), 1.0], 2), ([1.0], True)):
        with pytest.raises(InvalidRequestError):
            group_advantages(rewards, size)


def test_rows_are_prompt_plus_completion_with_the_samplers_log_probs():
    batch = rollout_batch(ANSWER, [0.5, -0.5, 1.0, -1.0])
    assert batch == {
        "input_ids": [[5, 6, 7, 8], [5, 6, 9], [4, 3, 2, 1], [4, 1]],
        "loss_mask": [[0, 0, 1, 1], [0, 0, 1], [0, 1, 1, 1], [0, 1]],
        "advantages": [0.5, -0.5, 1.0, -1.0],
        "rollout_log_probs": [
            [0.0, 0.0, -0.5, -0.25],
            [0.0, 0.0, -1.0],
            [0.0, -0.1, -0.2, -0.3],
            [0.0, -2.0],
        ],
    }
    Batch.build(batch)  # what fwd_bwd accepts
    assert rollout_batch(ANSWER["outputs"], [0.5, -0.5, 1.0, -1.0]) == batch


def test_rows_of_a_zero_advantage_can_be_left_out():
    batch = rollout_batch(ANSWER, [0.0, 0.0, 1.0, -1.0], drop_zero_advantage=True)
    assert batch["input_ids"] == [[4, 3, 2, 1], [4, 1]] and batch["advantages"] == [1.0, -1.0]


def test_wrong_counts_and_missing_log_probs_are_refused_by_name():
    with pytest.raises(InvalidRequestError, match="3 advantages for 4 completions"):
        rollout_batch(ANSWER, [1.0, 0.0, 0.0])
    broken = {"outputs": [{"prompt_token_ids": [1], "completions": [{"token_ids": [2, 3]}]}]}
    with pytest.raises(InvalidRequestError, match="completion 0 has 2 tokens and no log-probs"):
        rollout_batch(broken, [1.0])
    broken["outputs"][0]["completions"][0]["logprobs"] = [-1.0]
    with pytest.raises(InvalidRequestError, match="2 tokens and 1 log-probs"):
        rollout_batch(broken, [1.0])
    with pytest.raises(InvalidRequestError, match="generate's answer"):
        rollout_batch({"no": "outputs"}, [])
