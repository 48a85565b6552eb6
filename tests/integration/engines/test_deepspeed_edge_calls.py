"""Edge calls a training loop makes, on the DeepSpeed engine (one process, ZeRO 0-3).

A ``step`` with nothing accumulated changes nothing (weights, optimizer state, lr schedule,
``global_step``) and answers ``applied: False``; an empty batch is refused before anything
accumulates; loading the step it is at discards pending gradients; saving twice at one step
rewrites the one checkpoint. World size 2 is covered in ``test_deepspeed_world2.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")

from test_deepspeed_training import (
    SCHEDULED,
    make_batch,
    make_engine,
    max_weight_diff,
    train,
    weights,
)

from arctic_platform.rl.batch import BatchError

pytestmark = pytest.mark.slow


def assert_step_applies_nothing(engine: Any, step: int, before: dict[str, Any]) -> None:
    """A ``step`` now answers ``applied: False`` at ``step`` and leaves the weights unchanged."""
    answer = engine.step()
    assert answer["applied"] is False and answer["global_step"] == step
    assert max_weight_diff(weights(engine), before) == 0.0


@pytest.fixture(scope="module")
def zero3(tiny_model_path: str) -> Any:
    """One ZeRO-3 engine shared by the tests below (each works from whatever step it is at)."""
    engine = make_engine(tiny_model_path, stage=3, training=SCHEDULED)
    yield engine
    engine.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_step_with_nothing_accumulated_changes_nothing(
    tiny_model_path: str, tmp_path: Path, stage: int
) -> None:
    engine = make_engine(tiny_model_path, stage=stage, training=SCHEDULED)
    try:
        first = engine.step()  # a fresh engine (a worker that just reconnected)
        assert first["applied"] is False and first["global_step"] == 0
        train(engine, 1)
        path = engine.save_checkpoint(str(tmp_path))
        before = weights(engine)
        idle = engine.step(learning_rate=0.5)  # the override applies to no step: it is dropped
        assert idle["applied"] is False and idle["global_step"] == 1
        assert idle["grad_norm"] == 0.0 and "reason" in idle
        assert max_weight_diff(weights(engine), before) == 0.0
        after_idle = train(engine, 2, seed=50)
        after_idle_weights = weights(engine)
        assert engine.global_step == 3
        # The same two steps from the checkpoint, without the idle step: bitwise the same, so
        # the idle step left the optimizer moments, the schedule and the step count alone.
        assert engine.load_checkpoint(path) == 1
        assert train(engine, 2, seed=50) == after_idle
        assert max_weight_diff(weights(engine), after_idle_weights) == 0.0
    finally:
        engine.close()


def test_a_normal_step_says_it_was_applied(zero3: Any) -> None:
    step = zero3.global_step
    zero3.fwd_bwd(make_batch(1), "cross_entropy")
    answer = zero3.step()
    assert answer["applied"] is True and answer["global_step"] == step + 1
    assert zero3.step()["applied"] is False  # a second step has nothing left to apply


def test_an_empty_batch_is_refused_and_accumulates_nothing(zero3: Any) -> None:
    before, step = weights(zero3), zero3.global_step
    with pytest.raises(BatchError, match="empty"):
        zero3.fwd_bwd({"input_ids": [], "loss_mask": [], "advantages": []}, "grpo")
    assert_step_applies_nothing(zero3, step, before)


def test_loading_the_step_it_is_at_discards_pending_gradients(zero3: Any, tmp_path: Path) -> None:
    train(zero3, 1)
    step = zero3.global_step
    path = zero3.save_checkpoint(str(tmp_path))
    before = weights(zero3)
    zero3.fwd_bwd(make_batch(2), "cross_entropy")  # accumulated, then the load drops it
    assert zero3.load_checkpoint(path) == step
    assert max_weight_diff(weights(zero3), before) == 0.0
    assert_step_applies_nothing(zero3, step, before)


def test_saving_twice_at_one_step_rewrites_one_checkpoint(zero3: Any, tmp_path: Path) -> None:
    train(zero3, 1)
    step = zero3.global_step
    first = zero3.save_checkpoint(str(tmp_path))
    second = zero3.save_checkpoint(str(tmp_path))
    assert first == second and Path(first).name == f"global_step{step}"
    assert [p.name for p in tmp_path.iterdir()] == [f"global_step{step}"]
    before = weights(zero3)
    assert zero3.load_checkpoint(str(tmp_path)) == step
    assert max_weight_diff(weights(zero3), before) == 0.0
