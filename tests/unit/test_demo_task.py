"""The demo's task is exact match on reversed digits, with a fixed held-out set never trained on."""

from __future__ import annotations

import random

import pytest

from arctic_rl_demo.tasks.reverse.task import ReverseDigitsTask, group_advantages


def test_the_answer_is_the_digits_reversed():
    assert ReverseDigitsTask.answer("3814") == "4183"
    assert ReverseDigitsTask.prompt("3814") == "reverse 3814:"


def test_only_the_exact_answer_is_rewarded():
    assert ReverseDigitsTask.reward(" 4183", "4183") == 1.0
    assert ReverseDigitsTask.reward("4183 ", "4183") == 1.0
    assert ReverseDigitsTask.reward(" 4138", "4183") == 0.0
    assert ReverseDigitsTask.reward(" 41835", "4183") == 0.0
    assert ReverseDigitsTask.reward("", "4183") == 0.0


def test_the_demonstration_is_the_answer_after_a_space():
    assert ReverseDigitsTask.demonstration("4183") == " 4183"


def test_heldout_set_is_fixed_distinct_and_sized():
    task = ReverseDigitsTask(digits=4, heldout_size=64)
    again = ReverseDigitsTask(digits=4, heldout_size=64)
    assert task.heldout == again.heldout
    assert len({p for p, _ in task.heldout}) == 64
    for prompt, answer in task.heldout:
        digits = prompt.removeprefix("reverse ").removesuffix(":")
        assert len(digits) == 4 and answer == digits[::-1]


def test_training_prompts_never_include_a_heldout_prompt():
    task = ReverseDigitsTask(digits=2, heldout_size=25)  # a quarter of all 100 prompts
    heldout = {p for p, _ in task.heldout}
    drawn = task.prompts(2000, random.Random(0))
    assert not heldout & {p for p, _ in drawn}
    assert len({p for p, _ in drawn}) == 100 - 25


def test_training_prompts_follow_the_rng():
    task = ReverseDigitsTask()
    assert task.prompts(5, random.Random(3)) == task.prompts(5, random.Random(3))


def test_a_heldout_set_larger_than_a_quarter_of_all_prompts_is_refused():
    with pytest.raises(ValueError, match="heldout_size"):
        ReverseDigitsTask(digits=2, heldout_size=26)


def test_group_advantages_are_normalised_per_group():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], group_size=2)
    assert adv[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert adv[2:] == [0.0, 0.0]


def test_group_advantages_reject_a_ragged_split():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1.0, 2.0], group_size=3)


def test_the_demos_correction_choices_are_none_and_every_preset_of_the_losses():
    from arctic_platform.rl.rollout_correction import PRESETS
    from arctic_rl_demo.mismatch import mismatch_record
    from arctic_rl_demo.settings import CORRECTION_CHOICES

    assert CORRECTION_CHOICES[0] == "none"
    assert sorted(CORRECTION_CHOICES[1:]) == sorted(PRESETS)
    record = mismatch_record({"mismatch_k3": 0.5, "mismatch_ratio.max": 2.0})
    assert record["mismatch_k3"] == 0.5 and record["mismatch_ratio_max"] == 2.0
    assert record["mismatch_k1"] is None


def test_the_digits_reward_counts_digits_in_place_and_extra_characters_cost():
    task = ReverseDigitsTask(train_reward_kind="digits")
    assert task.train_reward(" 4183", "4183") == 1.0 == task.reward(" 4183", "4183")
    assert task.train_reward(" 4180", "4183") == 0.75
    assert task.train_reward(" 418", "4183") == 0.75
    assert task.train_reward(" 418322", "4183") == pytest.approx(4 / 6)
    assert task.train_reward(" 3814", "4183") == 0.0
    assert ReverseDigitsTask().train_reward(" 4180", "4183") == 0.0  # exact by default
    assert task.reward(" 4180", "4183") == 0.0  # evaluation stays exact
    with pytest.raises(ValueError, match="reward 'partial'"):
        ReverseDigitsTask(train_reward_kind="partial")
