"""``step`` honours AdamW settings per call, and ``fwd_bwd`` returns the log-probs it trained."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from test_deepspeed_training import make_batch, make_engine, weights  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    """Two engines with the same start weights (one reference, one with changed settings)."""
    pair = [make_engine(tiny_model_path, training={"optimizer": {"lr": 1e-3}}) for _ in range(2)]
    yield pair
    for engine in pair:
        engine.close()


def test_step_sets_betas_eps_weight_decay_and_clipping_and_decay_is_decoupled(engines):
    plain, decayed = engines
    batch = make_batch(0)
    before = weights(plain)
    for engine in engines:
        engine.fwd_bwd(batch, "cross_entropy")
    lr, wd = 1e-3, 0.5
    plain.step(
        lr, {"beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.0, "grad_clip_norm": 0.0}
    )
    decayed.step(
        lr, {"beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": wd, "grad_clip_norm": 0.0}
    )
    group = decayed._engine.optimizer.param_groups[0]
    assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-6 and group["weight_decay"] == wd
    assert decayed._engine.optimizer.clip_norm == 0.0
    a, b = weights(plain), weights(decayed)
    # AdamW's decoupled decay: the only difference is -lr * wd * w (same gradients)
    for name, w in before.items():
        assert torch.allclose(b[name] - a[name], -lr * wd * w, atol=1e-7), name


def test_fwd_bwd_returns_the_log_probs_of_target_tokens_and_forward_only_changes_nothing(engines):
    engine = engines[0]
    batch = make_batch(1, rows=3)
    scored = engine.fwd_no_grad({"input_ids": batch["input_ids"]})
    out = engine.fwd_bwd(batch, "cross_entropy", return_log_probs=True, forward_only=True)
    for row, expected in zip(out["log_probs"], scored, strict=True):
        assert max(abs(x - y) for x, y in zip(row, expected, strict=True)) < 1e-5
    # explicit targets equal to the next tokens score the same
    shifted = {**batch, "target_tokens": [list(r) for r in batch["input_ids"]]}
    again = engine.fwd_bwd(shifted, "cross_entropy", return_log_probs=True, forward_only=True)
    assert again["log_probs"] == out["log_probs"]
    assert engine.step()["applied"] is False  # forward_only accumulated nothing
