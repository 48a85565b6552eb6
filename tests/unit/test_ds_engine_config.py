"""DeepSpeed engine settings and micro-batch plans, without starting DeepSpeed."""

from __future__ import annotations

import math

import pytest

from arctic_platform.rl.config import OptimizerConfig, TrainingConfig
from arctic_platform.rl.errors import EngineConfigError
from arctic_rl_engines.ds_config import (
    forward_setup,
    lr_schedule,
    reference_ds_config,
    training_setup,
)
from arctic_rl_engines.microbatch import DUMMY, plan, shard_rows, split_by_budget


def test_training_config_maps_onto_deepspeed_defaults() -> None:
    tc = TrainingConfig.model_validate(
        {
            "optimizer": {"gradient_clipping": 0.5},
            "dtype": "bf16",
            "mb_spec": {"max_tokens_per_mb": 256},
            "gradient_checkpointing": True,
            "attn_impl": "eager",
        }
    )
    s = training_setup({"zero_optimization": {"stage": 2}}, tc, on_cpu=True)
    assert s.ds_config["bf16"] == {"enabled": True}
    assert s.ds_config["gradient_clipping"] == 0.5
    assert s.ds_config["managed_gradient_accumulation"] is False
    assert s.ds_config["gradient_accumulation_steps"] == 1
    assert s.zero_stage == 2 and s.dtype == "bfloat16"
    assert (s.max_tokens_per_mb, s.gradient_checkpointing, s.attn_impl) == (256, True, "eager")


def test_user_ds_config_wins_and_merges_deeply() -> None:
    user = {
        "gradient_clipping": 2.0,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "train_batch_size": 64,
    }
    s = training_setup(user, None, on_cpu=True)
    assert s.ds_config["gradient_clipping"] == 2.0
    assert s.ds_config["zero_optimization"] == {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
    }
    assert "train_batch_size" not in s.ds_config  # nominal: batches are split by tokens
    assert user["zero_optimization"] == {"stage": 3, "stage3_param_persistence_threshold": 0}
    ref = reference_ds_config(s)
    assert ref["zero_optimization"]["stage"] == 3 and "optimizer" not in ref


@pytest.mark.parametrize(
    ("ds_config", "training", "match"),
    [
        ({"gradient_accumulation_steps": 4}, None, "max_tokens_per_mb"),
        ({"managed_gradient_accumulation": True}, None, "accumulation boundary"),
        ({"zero_optimization": {"stage": 4}}, None, "not 0, 1, 2 or 3"),
        ({"bf16": {"enabled": True}}, {"dtype": "float32"}, "disagrees"),
        ({}, {"dtype": "float16"}, "float16 is not supported by DeepSpeed's CPU"),
        ({"fp16": {"enabled": True}}, None, "float16 is not supported"),
    ],
)
def test_settings_that_cannot_be_honoured_are_refused(
    ds_config: dict, training: dict | None, match: str
) -> None:
    tc = TrainingConfig.model_validate(training) if training is not None else None
    with pytest.raises(EngineConfigError, match=match):
        training_setup(ds_config, tc, on_cpu=True)


def test_float16_is_accepted_off_cpu() -> None:
    s = training_setup({}, TrainingConfig(dtype="fp16"), on_cpu=False)
    assert s.ds_config["fp16"]["enabled"] is True and s.dtype == "float16"


def test_log_prob_worker_config_splits_our_keys_from_deepspeed() -> None:
    s = forward_setup(
        {"dtype": "bf16", "max_tokens_per_mb": 512, "zero_optimization": {"stage": 3}},
        on_cpu=True,
    )
    assert (s.dtype, s.max_tokens_per_mb, s.zero_stage) == ("bfloat16", 512, 3)
    assert "dtype" not in s.ds_config and s.ds_config["bf16"] == {"enabled": True}
    with pytest.raises(EngineConfigError, match="forward-only"):
        forward_setup({"optimizer": {"type": "AdamW"}}, on_cpu=True)


def test_cosine_schedule_with_warmup() -> None:
    f = lr_schedule(OptimizerConfig(lr_scheduler_type="cosine", warmup_ratio=0.1, total_steps=20))
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(11) == pytest.approx(0.5 * (1 + math.cos(math.pi * 9 / 18)))
    assert f(20) == pytest.approx(0.0) and f(100) == pytest.approx(0.0)


def test_constant_schedule_needs_no_total_but_decay_does() -> None:
    assert lr_schedule(OptimizerConfig())(1000) == 1.0
    with pytest.raises(EngineConfigError, match="total_steps"):
        lr_schedule(OptimizerConfig(lr_scheduler_type="linear"))
    with pytest.raises(EngineConfigError, match="total_steps"):
        lr_schedule(OptimizerConfig(warmup_ratio=0.1))


def test_rows_are_sharded_round_robin() -> None:
    assert shard_rows(7, 0, 2) == [0, 2, 4, 6] and shard_rows(7, 1, 2) == [1, 3, 5]
    assert shard_rows(1, 1, 2) == []


def test_budget_counts_padded_tokens_and_keeps_every_row_once() -> None:
    lengths = [10, 3, 8, 8, 2, 30]
    groups = split_by_budget(range(6), lengths, 20)
    assert sorted(r for g in groups for r in g) == list(range(6))
    assert groups[0] == [5]  # longer than the budget: alone
    for g in groups[1:]:
        assert len(g) * max(lengths[r] for r in g) <= 20
    assert split_by_budget([0, 1], lengths, None) == [[0, 1]]


def test_every_rank_plans_the_same_number_of_passes() -> None:
    lengths = [16, 16, 16, 16, 16]  # rank 0 gets 3 rows, rank 1 two
    p0, p1 = plan(lengths, 0, 2, 16), plan(lengths, 1, 2, 16)
    assert len(p0) == len(p1) == 3
    assert p1[-1] == [DUMMY] and all(DUMMY not in g for g in p0)
    assert plan([5], 1, 2, None) == [[DUMMY]]
