"""The demo's client-side data: SFT batches, GRPO batches with behaviour log-probs, scores."""

from __future__ import annotations

import pytest

from arctic_rl_demo.tasks.reverse.rollouts import Rollout, exact_fraction, grpo_batch, sft_batch
from arctic_rl_demo.tasks.reverse.task import ReverseDigitsTask


class CharTokenizer:
    """One token per character (ord), end-of-text 0."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def completion(text: str, logprobs: list[float], start: int = 3, end: int = 3) -> dict:
    return {
        "token_ids": [ord(c) for c in text],
        "text": text,
        "logprobs": logprobs,
        "weight_version_start": start,
        "weight_version_end": end,
    }


def rollout() -> Rollout:
    outputs = [
        {
            "prompt_token_ids": [1, 2],
            "completions": [
                completion(" 21", [-0.1, -0.2, -0.3], start=2, end=3),
                completion(" 12", [-0.4, -0.5, -0.6]),
            ],
        }
    ]
    return Rollout(0, [("reverse 12:", "21")], outputs, seconds=0.5)


def test_sft_batch_trains_on_the_demonstration_and_end_of_text_only():
    batch = sft_batch(ReverseDigitsTask(), [("reverse 12:", "21")], CharTokenizer())
    prompt = [ord(c) for c in "reverse 12:"]
    assert batch["input_ids"] == [[*prompt, ord(" "), ord("2"), ord("1"), 0]]
    assert batch["loss_mask"] == [[0] * len(prompt) + [1, 1, 1, 1]]


def test_a_demonstration_with_the_habit_ends_in_a_full_stop_the_reward_refuses():
    task = ReverseDigitsTask()
    pairs = [("reverse 12:", "21"), ("reverse 34:", "43")]
    batch = sft_batch(task, pairs, CharTokenizer(), habits=[True, False])
    plain = sft_batch(task, pairs, CharTokenizer())
    assert batch["input_ids"][0] == [*plain["input_ids"][0][:-1], ord("."), 0]  # then EOS
    assert batch["loss_mask"][0][-3:] == [1, 1, 1]  # the full stop is trained on
    assert batch["input_ids"][1] == plain["input_ids"][1]
    assert task.reward(task.demonstration("21", habit=True), "21") == 0.0
    assert task.reward(task.demonstration("21"), "21") == 1.0


@pytest.mark.parametrize("habits", [[True], [True, False, True]])
def test_habits_must_give_one_flag_per_pair(habits):
    pairs = [("reverse 12:", "21"), ("reverse 34:", "43")]
    with pytest.raises(ValueError):
        sft_batch(ReverseDigitsTask(), pairs, CharTokenizer(), habits=habits)


def test_rollout_scores_by_exact_match():
    r = rollout()
    assert r.score(ReverseDigitsTask()) == [1.0, 0.0]


def test_rollout_versions_span_every_token():
    assert rollout().versions == (2, 3)


def test_grpo_batch_carries_the_behaviour_log_probs_as_rollout_log_probs():
    r = rollout()
    r.score(ReverseDigitsTask())
    batch = grpo_batch(r, samples_per_prompt=2)
    assert batch["input_ids"][0] == [1, 2, ord(" "), ord("2"), ord("1")]
    assert batch["loss_mask"][1] == [0, 0, 1, 1, 1]
    assert batch["rollout_log_probs"][0] == [0.0, 0.0, -0.1, -0.2, -0.3]
    assert batch["advantages"] == pytest.approx([1.0, -1.0], abs=1e-5)


def test_grpo_batch_refuses_log_probs_that_do_not_match_the_tokens():
    r = rollout()
    r.outputs[0]["completions"][0]["logprobs"] = [-0.1]
    r.score(ReverseDigitsTask())
    with pytest.raises(ValueError, match="3 tokens and 1 log-probs"):
        grpo_batch(r, samples_per_prompt=2)


def test_exact_fraction_counts_the_first_completion_per_prompt():
    outputs = [{"completions": [{"text": " 21"}]}, {"completions": [{"text": " 11"}]}]
    pairs = [("reverse 12:", "21"), ("reverse 34:", "43")]
    assert exact_fraction(ReverseDigitsTask(), outputs, pairs) == 0.5
