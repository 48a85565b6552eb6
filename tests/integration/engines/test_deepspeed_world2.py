"""The DeepSpeed training engine in a real world of 2 CPU processes (gloo on 127.0.0.1).

Both ranks get the same whole batch and each takes rows ``rank::2``; the results must equal
a one-process run on the whole batch, for ZeRO 0, 2 and 3.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_build import registry_engine

pytest.importorskip("deepspeed")

from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("ds_world_worker.py")
STAGES = (0, 2, 3)
STEPS = 20
TIMEOUT_S = 300


def make_spec(model_path: str, checkpoint_dir: str) -> dict[str, Any]:
    """9 ragged rows (ranks get 5 and 4) in micro-batches of 40 tokens, so the ranks run
    different numbers of real passes and the lighter one pads with zero-weight passes."""
    rng = random.Random(11)
    ids = [[rng.randrange(10, 400) for _ in range(rng.randint(5, 20))] for _ in range(9)]
    old = [
        [0.0] + [-6.0 + 0.1 * ((7 * i + j) % 5) for j in range(1, len(r))]
        for i, r in enumerate(ids)
    ]
    return {
        "model_path": model_path,
        "checkpoint_dir": checkpoint_dir,
        "stages": list(STAGES),
        "steps": STEPS,
        "training": {"optimizer": {"lr": 1e-3}, "mb_spec": {"max_tokens_per_mb": 40}},
        "grpo_config": {"kl_coef": 0.05, "entropy_coef": 0.01},
        "batch": {
            "input_ids": ids,
            "loss_mask": [[0.0, 0.0] + [1.0] * (len(r) - 2) for r in ids],
            "advantages": [(-1.0) ** i * (1 + i / 10) for i in range(9)],
            "old_log_probs": old,
            "ref_log_probs": old,
        },
    }


def run_world(spec: dict[str, Any], tmp_path: Path, world: int = 2) -> list[dict[str, Any]]:
    """Start ``world`` worker processes, wait for all, return each rank's results."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            ARCTIC_RL_NUM_THREADS="1",
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
        )
        out = tmp_path / f"rank{rank}.json"
        log = open(tmp_path / f"rank{rank}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(spec_path), str(out)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
                out,
            )
        )
    try:
        for proc, _, _ in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for proc, log, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    for rank, (proc, _, _) in enumerate(procs):
        if proc.returncode != 0:
            tail = (tmp_path / f"rank{rank}.log").read_text()[-4000:]
            pytest.fail(f"rank {rank} exited with {proc.returncode}:\n{tail}")
    return [json.loads(out.read_text()) for _, _, out in procs]


def run_single(spec: dict[str, Any], stage: int) -> dict[str, Any]:
    """The same schedule in this process, world size 1, on the whole batch."""
    engine = _one_process_engine(spec, stage)
    try:
        batch = spec["batch"]
        first = engine.fwd_bwd(batch, "grpo", spec["grpo_config"])
        first_step = engine.step()
        ce = {k: batch[k] for k in ("input_ids", "loss_mask")}
        losses = []
        for _ in range(spec["steps"] - 1):
            losses.append(engine.fwd_bwd(ce, "cross_entropy")["loss"])
            engine.step()
        return {
            "first": first,
            "first_step": first_step,
            "losses": losses,
            "log_probs": engine.fwd_no_grad(ce),
            "weight_norm": engine.weight_norm(),
        }
    finally:
        engine.close()


@pytest.fixture(scope="module")
def world2(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("world2")
    spec = make_spec(tiny_model_path, str(tmp / "checkpoints"))
    return spec, run_world(spec, tmp)


@pytest.mark.parametrize("stage", STAGES)
def test_two_ranks_train_like_one_process_on_the_whole_batch(world2: Any, stage: int) -> None:
    spec, ranks = world2
    r0, r1 = (r[str(stage)] for r in ranks)
    single = run_single(spec, stage)
    print(f"world 2 ZeRO-{stage} loss curve:", [round(x, 3) for x in r0["losses"]])
    # A step with nothing accumulated after the first (ranks: idle_step) changed nothing:
    # the losses below still follow the one-process run, which has no such step.
    for r in (r0, r1):
        assert r["idle_step"]["applied"] is False and r["idle_step"]["global_step"] == 1
        assert r["first_step"]["applied"] is True
    # Every rank reports the same, globally reduced metrics.
    assert r0["first"] == r1["first"] and r0["losses"] == r1["losses"]
    assert r0["first"]["micro_batches"] >= 2
    for key, value in single["first"].items():
        if key != "micro_batches":
            assert r0["first"][key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
    assert r0["first_step"]["grad_norm"] == pytest.approx(
        single["first_step"]["grad_norm"], rel=1e-5
    )
    assert r0["losses"] == pytest.approx(single["losses"], rel=1e-4)
    assert r0["losses"][-1] < 0.6 * r0["losses"][0]
    assert r0["weight_norm"] == pytest.approx(single["weight_norm"], rel=1e-6)
    diff = max(
        abs(a - b)
        for x, y in zip(r0["log_probs"], single["log_probs"], strict=True)
        for a, b in zip(x, y, strict=True)
    )
    assert diff < 1e-3 and r0["log_probs"] == r1["log_probs"]


@pytest.mark.parametrize("stage", STAGES)
def test_two_ranks_resume_bitwise_and_export_full_weights(world2: Any, stage: int) -> None:
    _, ranks = world2
    for r in ranks:
        out = r[str(stage)]
        assert out["restored_step"] == STEPS
        assert out["resumed"] == out["straight"]
        assert out["gathered_norm"] == pytest.approx(out["weight_norm"], rel=1e-9)
    assert ranks[0][str(stage)]["shapes"] == ranks[1][str(stage)]["shapes"]
    if stage == 3:  # each rank holds about half of every parameter
        total = sum(math.prod(s) for s in ranks[0]["3"]["shapes"].values())
        assert all(r["3"]["local_numel"] <= total / 2 + 64 for r in ranks)


def _one_process_engine(spec: dict[str, Any], stage: int, **extra: Any) -> Any:
    """A world-size-1 DeepSpeed training engine at ZeRO ``stage`` on ``spec``'s schedule."""
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    config = ArcticRLClientConfig(
        model_name=spec["model_path"],
        training_gpus=1,
        ds_config={"zero_optimization": zero},
        training_config=TrainingConfig.model_validate(spec["training"]),
        **extra,
    )
    return registry_engine("deepspeed", "training", config)


def test_a_zero0_checkpoint_of_two_ranks_resumes_in_one_process(world2: Any) -> None:
    spec, ranks = world2
    engine = _one_process_engine(spec, 0)
    try:
        ce = {k: spec["batch"][k] for k in ("input_ids", "loss_mask")}
        assert engine.load_checkpoint(str(Path(spec["checkpoint_dir"]) / "zero0")) == STEPS
        loss = engine.fwd_bwd(ce, "cross_entropy")["loss"]
    finally:
        engine.close()
    assert loss == pytest.approx(ranks[0]["0"]["straight"][0], rel=1e-5)


def test_a_sharded_checkpoint_refuses_another_world_size(world2: Any) -> None:
    from arctic_platform.rl.errors import CheckpointError

    spec, _ = world2
    engine = _one_process_engine(spec, 3)
    try:
        with pytest.raises(CheckpointError, match="written by 2 ranks with ZeRO stage 3"):
            engine.load_checkpoint(str(Path(spec["checkpoint_dir"]) / "zero3"))
    finally:
        engine.close()
    # Its Hugging Face export starts a new run anywhere.
    fresh = _one_process_engine(
        spec, 3, checkpoint_path=str(Path(spec["checkpoint_dir"]) / "zero3" / "hf")
    )
    try:
        assert fresh.global_step == 0
        assert fresh.weight_norm() == pytest.approx(ranks_weight_norm(world2), rel=1e-6)
    finally:
        fresh.close()


def ranks_weight_norm(world2: Any) -> float:
    """Rank 0's weight norm when the ZeRO-3 checkpoint was written (after STEPS steps)."""
    return float(world2[1][0]["3"]["weight_norm"])
