"""The demo's reward is exact and its advantages are group-normalised."""

from __future__ import annotations

import random

import pytest

from arctic_platform.rl.demo_task import DigitSumTask, group_advantages


def test_exact_answer_gets_full_reward():
    assert DigitSumTask.reward("355", 13) == pytest.approx(1.0)


def test_no_digits_gets_zero():
    assert DigitSumTask.reward("abc", 5) == 0.0
    assert DigitSumTask.reward("", 5) == 0.0


def test_partial_credit_for_format_and_closeness():
    # digits 2+2=4 for target 8: closeness 0.5; one of three chars is not a digit: format 2/3
    assert DigitSumTask.reward("2x2", 8) == pytest.approx(0.3 * 2 / 3 + 0.7 * 0.5)


def test_far_sums_get_no_closeness():
    assert DigitSumTask.reward("99999", 3) == pytest.approx(0.3)


def test_prompts_name_their_target():
    pairs = DigitSumTask(low=4, high=4).prompts(3, random.Random(0))
    assert pairs == [("digits summing to 4:", 4)] * 3


def test_group_advantages_are_normalised_per_group():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], group_size=2)
    assert adv[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert adv[2:] == [0.0, 0.0]


def test_group_advantages_reject_a_ragged_split():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1.0, 2.0], group_size=3)
