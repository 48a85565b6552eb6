"""The DeepSpeed training engine on CPU, one process: training, exactness, determinism, resume."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from engine_build import registry_engine

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from arctic_platform.rl.batch import BatchError  # noqa: E402
from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig  # noqa: E402
from arctic_platform.rl.errors import (  # noqa: E402
    CheckpointError,
    EngineConfigError,
    LossConfigError,
)

pytestmark = pytest.mark.slow

VOCAB_LOW, VOCAB_HIGH = 10, 400  # token ids used by the batches (the tiny vocab has ~425)

# A warmup + cosine optimizer schedule that resume tests replay exactly.
SCHEDULED = {
    "optimizer": {
        "lr": 1e-3,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.2,
        "total_steps": 10,
        "weight_decay": 0.01,
    }
}


def make_batch(seed: int, rows: int = 8, low: int = 6, high: int = 24) -> dict[str, Any]:
    """Ragged rows with a 3-token prompt (not trained) and ±1 advantages per sequence."""
    rng = random.Random(seed)
    ids = [
        [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randint(low, high))]
        for _ in range(rows)
    ]
    return {
        "input_ids": ids,
        "loss_mask": [[0.0] * 3 + [1.0] * (len(r) - 3) for r in ids],
        "advantages": [1.0 if i % 2 == 0 else -1.0 for i in range(rows)],
    }


def make_engine(model_path: str, **options: Any) -> Any:
    """The registered ``deepspeed`` training engine, built the way a job's worker builds it."""
    stage = options.pop("stage", 0)
    ds_config = {"zero_optimization": {"stage": stage}}
    if stage == 3:
        ds_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    ds_config.update(options.pop("ds_config", {}))
    training = {"optimizer": {"lr": 1e-3}}
    training.update(options.pop("training", {}))
    config = ArcticRLClientConfig(
        model_name=model_path,
        training_gpus=1,
        ds_config=ds_config,
        training_config=TrainingConfig.model_validate(training),
        **options,
    )
    return registry_engine("deepspeed", "training", config)


def weights(engine: Any) -> dict[str, torch.Tensor]:
    return dict(engine.named_weights())


def max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def train(engine: Any, steps: int, loss_fn: str = "cross_entropy", seed: int = 0) -> list[float]:
    losses = []
    for i in range(steps):
        metrics = engine.fwd_bwd(make_batch(seed + i), loss_fn)
        engine.step()
        losses.append(metrics["loss"])
    return losses


def train_on_one_batch(engine: Any, steps: int) -> list[float]:
    """``steps`` cross-entropy steps on ``make_batch(0)`` each time; the losses."""
    batch = make_batch(0)
    losses = []
    for _ in range(steps):
        losses.append(engine.fwd_bwd(batch, "cross_entropy")["loss"])
        engine.step()
    return losses


@pytest.fixture(scope="module")
def engines() -> Any:
    """Close every engine a test built, at the end of the module."""
    built: list[Any] = []
    yield built
    for engine in built:
        engine.close()


@pytest.fixture(scope="module")
def fresh_zero0(tiny_model_path: str, engines: list[Any]) -> Any:
    """A ZeRO-0 engine that tests use read-only (no step is ever taken on it)."""
    engine = make_engine(tiny_model_path)
    engines.append(engine)
    return engine


@pytest.mark.parametrize("stage", [0, 3])
def test_loss_falls_over_20_steps(tiny_model_path: str, stage: int) -> None:
    engine = make_engine(tiny_model_path, stage=stage)
    try:
        losses = train_on_one_batch(engine, 20)
        print(f"ZeRO-{stage} loss curve:", [round(x, 3) for x in losses])
        assert engine.global_step == 20
        assert losses[-1] < 0.6 * losses[0]
        assert sum(b < a for a, b in itertools.pairwise(losses)) >= 17
    finally:
        engine.close()


def test_grpo_raises_log_probs_of_positive_advantage_rows(tiny_model_path: str) -> None:
    engine = make_engine(tiny_model_path)
    try:
        batch = make_batch(1)
        before = engine.fwd_no_grad(batch)
        for _ in range(5):
            old = engine.fwd_no_grad(batch)
            metrics = engine.fwd_bwd({**batch, "old_log_probs": old}, "grpo")
            engine.step()
        after = engine.fwd_no_grad(batch)
        deltas = [sum(a[3:]) - sum(b[3:]) for a, b in zip(after, before, strict=True)]
        assert all(d > 0 for d in deltas[0::2]) and all(d < 0 for d in deltas[1::2])
        assert metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    finally:
        engine.close()


def test_micro_batched_update_equals_one_batch_update(tiny_model_path: str) -> None:
    # Adam divides by |g|, so a float-noise difference in a near-zero gradient moves a weight
    # by up to lr; eps=1 makes the update ~ lr * g, so weights compare the gradients themselves.
    batch = make_batch(2, rows=10)
    optimizer = {"lr": 1e-2, "eps": 1.0}
    one = make_engine(tiny_model_path, training={"optimizer": optimizer})
    many = make_engine(
        tiny_model_path,
        training={"optimizer": optimizer, "mb_spec": {"max_tokens_per_mb": 48}},
    )
    try:
        old = one.fwd_no_grad(batch)
        noisy = [
            [x + 0.05 * math.sin(7 * i + j) for j, x in enumerate(r)] for i, r in enumerate(old)
        ]
        full = {**batch, "old_log_probs": noisy, "ref_log_probs": old}
        config = {"kl_coef": 0.1, "entropy_coef": 0.01, "clip_ratio_c": 3.0}
        for loss_fn in ("grpo", "ppo"):
            m1 = one.fwd_bwd(full, loss_fn, config)
            m2 = many.fwd_bwd(full, loss_fn, config)
            assert m1["micro_batches"] == 1 and m2["micro_batches"] >= 4
            for key in m1:
                if key != "micro_batches":
                    assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-5), key
            s1, s2 = one.step(), many.step()
            assert s2["grad_norm"] == pytest.approx(s1["grad_norm"], rel=1e-5)
        diff = max_weight_diff(weights(one), weights(many))
        print(f"micro-batched vs one-batch update: max weight diff {diff:.3g}")
        assert diff < 1e-6  # float32 spacing of a weight near 1 is 1.2e-7
    finally:
        one.close()
        many.close()


def test_full_determinism_gives_bitwise_identical_losses(tiny_model_path: str) -> None:
    runs = []
    for _ in range(2):
        engine = make_engine(tiny_model_path, full_determinism=True, seed=7, stage=2)
        try:
            runs.append(train(engine, 5, "grpo"))
            runs[-1].append(engine.weight_norm())
        finally:
            engine.close()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("stage", [0, 3])
def test_resume_continues_bitwise_as_if_never_stopped(
    tiny_model_path: str, tmp_path: Path, stage: int
) -> None:
    engine = make_engine(
        tiny_model_path,
        stage=stage,
        training=SCHEDULED,
    )
    try:
        train(engine, 3)
        path = engine.save_checkpoint(str(tmp_path))
        assert Path(path).name == "global_step3"
        straight = train(engine, 3, seed=100)
        straight_weights = weights(engine)
        assert engine.load_checkpoint(path) == 3
        resumed = train(engine, 3, seed=100)
        assert resumed == straight
        assert max_weight_diff(weights(engine), straight_weights) == 0.0
    finally:
        engine.close()
    # A new job started from the checkpoint continues the same way.
    again = make_engine(
        tiny_model_path,
        stage=stage,
        checkpoint_path=str(tmp_path),
        training=SCHEDULED,
    )
    try:
        assert again.global_step == 3
        assert train(again, 3, seed=100) == straight
    finally:
        again.close()


def test_checkpoint_holds_a_hugging_face_export(tiny_model_path: str, tmp_path: Path) -> None:
    import transformers

    engine = make_engine(tiny_model_path, stage=3)
    try:
        train(engine, 2)
        path = Path(engine.save_checkpoint(str(tmp_path), tag="export"))
        ours = weights(engine)
    finally:
        engine.close()
    meta = json.loads((path / "arctic_rl_checkpoint.json").read_text())
    assert meta["global_step"] == 2 and meta["zero_stage"] == 3
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path / "hf"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path / "hf"))
    assert len(tokenizer) > 0
    exported = dict(model.named_parameters())
    assert exported.keys() == ours.keys()
    assert all(torch.equal(exported[k].detach(), ours[k]) for k in ours)


def test_half_written_checkpoints_are_never_loaded(tiny_model_path: str, tmp_path: Path) -> None:
    engine = make_engine(tiny_model_path)
    try:
        train(engine, 1)
        good = engine.save_checkpoint(str(tmp_path))
        # What a crash mid-save leaves: the temp dir, and a visible dir without its marker.
        (tmp_path / ".global_step9.tmp" / "deepspeed").mkdir(parents=True)
        (tmp_path / "global_step8" / "hf").mkdir(parents=True)
        assert engine.load_checkpoint(str(tmp_path)) == 1
        with pytest.raises(CheckpointError, match="no complete checkpoint"):
            engine.load_checkpoint(str(tmp_path / "global_step8"))
        # Saving again under the same tag replaces the old checkpoint in one rename.
        train(engine, 1)
        assert engine.save_checkpoint(str(tmp_path), tag="global_step1") == good
        assert engine.load_checkpoint(good) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            ".global_step9.tmp",
            "global_step1",
            "global_step8",
        ]
        with pytest.raises(CheckpointError):
            engine.save_checkpoint(str(tmp_path), tag="../escape")
    finally:
        engine.close()


def _transformers_log_probs(model_path: str, rows: list[list[int]]) -> list[list[float]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row])
            logits = model(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append([0.0, *lp.tolist()])
    return out


def test_fwd_no_grad_matches_a_plain_transformers_forward(
    tiny_model_path: str, fresh_zero0: Any
) -> None:
    batch = make_batch(3, rows=6, low=2, high=40)
    expected = _transformers_log_probs(tiny_model_path, batch["input_ids"])
    got = fresh_zero0.fwd_no_grad(batch)
    assert [len(r) for r in got] == [len(r) for r in batch["input_ids"]]
    assert all(r[0] == 0.0 for r in got)
    diff = max(
        abs(a - b)
        for ra, rb in zip(got, expected, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    print(f"fwd_no_grad vs transformers (float32): max abs diff {diff:.3g}")
    assert diff < 1e-4


def test_reference_model_keeps_the_initial_weights(tiny_model_path: str, tmp_path: Path) -> None:
    batch = make_batch(4, rows=4)
    expected = _transformers_log_probs(tiny_model_path, batch["input_ids"])
    engine = make_engine(tiny_model_path, stage=3)
    try:
        train(engine, 3)
        policy = engine.fwd_no_grad(batch)
        ref = engine.fwd_no_grad(batch, reference_model=True)
        engine.save_checkpoint(str(tmp_path))
    finally:
        engine.close()
    resumed = make_engine(tiny_model_path, stage=3, checkpoint_path=str(tmp_path))
    try:  # a resumed run keeps the reference of the run, not the checkpoint's weights
        assert resumed.fwd_no_grad(batch, reference_model=True) == ref
        again = resumed.fwd_no_grad(batch)
        assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(again, policy, strict=True))
    finally:
        resumed.close()
    ref_diff = max(
        abs(a - b)
        for ra, rb in zip(ref, expected, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    moved = max(
        abs(a - b)
        for ra, rb in zip(policy, expected, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    assert ref_diff < 1e-4 and moved > 1e-2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b["input_ids"][1].__setitem__(2, 100_000), "outside the vocabulary"),
        (lambda b: b["loss_mask"][0].pop(), r"loss_mask\[0\] has"),
        (lambda b: b["advantages"].pop(), "'advantages' has"),
        (lambda b: b["input_ids"].__setitem__(0, [1] * 5000), "more than the model's context"),
    ],
)
def test_bad_batch_is_refused_and_leaves_weights_unchanged(
    fresh_zero0: Any, change: Any, message: str
) -> None:
    before = weights(fresh_zero0)
    batch = make_batch(5)
    change(batch)
    with pytest.raises(BatchError, match=message):
        fresh_zero0.fwd_bwd(batch, "grpo")
    fresh_zero0.step()  # nothing accumulated, so nothing moves
    assert max_weight_diff(weights(fresh_zero0), before) == 0.0


def test_loss_config_errors_come_before_any_compute(fresh_zero0: Any) -> None:
    before = weights(fresh_zero0)
    with pytest.raises(LossConfigError, match="allowed"):
        fresh_zero0.fwd_bwd(make_batch(6), "ppo", {"clip_eps": 0.1})
    batch = make_batch(6)
    del batch["advantages"]
    with pytest.raises(BatchError, match="advantages"):
        fresh_zero0.fwd_bwd(batch, "grpo")
    with pytest.raises(BatchError, match="ref_log_probs"):
        fresh_zero0.fwd_bwd(make_batch(6), "grpo", {"kl_coef": 0.1})
    fresh_zero0.step()
    assert max_weight_diff(weights(fresh_zero0), before) == 0.0


def test_lr_schedule_warms_up_then_decays_and_override_lasts_one_step(tiny_model_path: str) -> None:
    engine = make_engine(
        tiny_model_path,
        training={
            "optimizer": {
                "lr": 1e-3,
                "lr_scheduler_type": "linear",
                "warmup_steps_proportion": 0.25,
                "total_steps": 8,
            }
        },
    )
    try:
        lrs = []
        for i in range(8):
            engine.fwd_bwd(make_batch(i), "cross_entropy")
            lrs.append(engine.step(learning_rate=5e-4 if i == 4 else None)["lr"])
    finally:
        engine.close()
    expected = [5e-4, 1e-3, 1e-3, 1e-3 * 5 / 6, 5e-4, 1e-3 * 3 / 6, 1e-3 * 2 / 6, 1e-3 / 6]
    assert lrs == pytest.approx(expected)


def test_gradient_checkpointing_and_attention_choice_give_the_same_update(
    tiny_model_path: str,
) -> None:
    optimizer = {"lr": 1e-2, "eps": 1.0}  # update ~ lr * g: weights compare the gradients
    plain = make_engine(tiny_model_path, training={"optimizer": optimizer, "attn_impl": "eager"})
    ckpt = make_engine(
        tiny_model_path,
        training={"optimizer": optimizer, "gradient_checkpointing": True, "attn_impl": "sdpa"},
    )
    try:
        a, b = train(plain, 2), train(ckpt, 2)
        assert b == pytest.approx(a, rel=1e-5)
        assert max_weight_diff(weights(plain), weights(ckpt)) < 1e-6
    finally:
        plain.close()
        ckpt.close()


def test_bf16_trains_and_fp16_is_refused_on_cpu(tiny_model_path: str) -> None:
    engine = make_engine(tiny_model_path, training={"dtype": "bfloat16"})
    try:
        losses = train_on_one_batch(engine, 6)
        assert losses[-1] < losses[0]
        assert all(t.dtype == torch.bfloat16 for _, t in engine.named_weights())
    finally:
        engine.close()
    with pytest.raises(EngineConfigError, match="float16 is not supported"):
        make_engine(tiny_model_path, training={"dtype": "float16"})


def test_named_weights_are_full_tensors_under_zero3(tiny_model_path: str, fresh_zero0: Any) -> None:
    engine = make_engine(tiny_model_path, stage=3)
    try:
        sharded = weights(engine)
        assert engine.weight_norm() == pytest.approx(fresh_zero0.weight_norm(), rel=1e-12)
    finally:
        engine.close()
    assert max_weight_diff(sharded, weights(fresh_zero0)) == 0.0


def test_sleep_and_wake_say_they_are_not_supported(fresh_zero0: Any) -> None:
    assert fresh_zero0.sleep()["supported"] is False
    assert fresh_zero0.wake()["supported"] is False
    assert "reason" in fresh_zero0.sleep()
