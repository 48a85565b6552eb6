"""One rank of a real multi-process DeepSpeed world, run by test_deepspeed_world2.py.

Usage: ``python ds_world_worker.py SPEC.json OUT.json`` with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and LOCAL_RANK set. For each ZeRO stage in the spec it trains the spec's batch
(one GRPO step, then cross-entropy steps), checks a save/continue vs load/continue round
trip, and writes what it saw as JSON. A spec whose ``training`` has ``lora`` runs
``run_lora`` for each stage instead.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any


def make_engine(spec: dict[str, Any], stage: int) -> Any:
    """This rank's training engine at ZeRO ``stage`` (stage 3 partitions every parameter)."""
    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    config = ArcticRLClientConfig(
        model_name=spec["model_path"],
        training_gpus=world,
        ds_config={"zero_optimization": zero},
        training_config=TrainingConfig.model_validate(spec["training"]),
    )
    return (
        get_registry()
        .get("engine", "deepspeed", role="training")
        .create(config, EngineContext(role="training", rank=rank, world_size=world))
    )


def run_stage(spec: dict[str, Any], stage: int) -> dict[str, Any]:
    """Train one engine at ``stage`` and report its metrics, losses and weights."""
    engine = make_engine(spec, stage)
    batch = spec["batch"]
    out: dict[str, Any] = {}
    try:
        out["first"] = engine.fwd_bwd(batch, "grpo", spec["grpo_config"])
        out["first_step"] = engine.step()
        out["idle_step"] = engine.step()  # nothing accumulated: must change nothing
        ce = {k: v for k, v in batch.items() if k in ("input_ids", "loss_mask")}
        out["losses"] = []
        for _ in range(spec["steps"] - 1):
            out["losses"].append(engine.fwd_bwd(ce, "cross_entropy")["loss"])
            engine.step()
        out["log_probs"] = engine.fwd_no_grad(ce)
        full = dict(engine.named_weights())
        out["shapes"] = {k: list(v.shape) for k, v in full.items()}
        out["gathered_norm"] = math.sqrt(
            sum(float(v.double().square().sum()) for v in full.values())
        )
        out["weight_norm"] = engine.weight_norm()
        if stage == 3:
            out["local_numel"] = sum(
                int(p.ds_tensor.numel()) for p in engine._engine.module.parameters()
            )

        def two_steps() -> list[float]:
            seen = []
            for _ in range(2):
                seen.append(engine.fwd_bwd(ce, "cross_entropy")["loss"])
                seen.append(engine.step()["grad_norm"])
            return seen

        path = engine.save_checkpoint(spec["checkpoint_dir"], tag=f"zero{stage}")
        out["straight"] = two_steps()
        out["restored_step"] = engine.load_checkpoint(path)
        out["resumed"] = two_steps()
    finally:
        engine.close()
    return out


def run_lora(spec: dict[str, Any], stage: int, out_path: str) -> dict[str, Any]:
    """LoRA at ``stage``: train ``steps`` cross-entropy steps, export the adapter (written next
    to ``out_path`` as safetensors) and save a checkpoint, recording peft's warnings."""
    import warnings

    from safetensors.torch import save_file

    engine = make_engine(spec, stage)
    ce = {k: v for k, v in spec["batch"].items() if k in ("input_ids", "loss_mask")}
    out: dict[str, Any] = {"losses": []}
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(spec["steps"]):
                out["losses"].append(engine.fwd_bwd(ce, "cross_entropy")["loss"])
                engine.step()
            adapter = dict(engine.named_weights())
            out["checkpoint"] = engine.save_checkpoint(
                spec["checkpoint_dir"], tag=f"lora-zero{stage}"
            )
        out["warnings"] = [str(w.message) for w in seen if "LoRA" in str(w.message)]
        out["lora_info"] = engine.lora_info()
        out["weight_norm"] = engine.weight_norm()
        lora = [p for n, p in engine._engine.module.named_parameters() if ".lora_" in n]
        out["local_lora_numel"] = sum(int(getattr(p, "ds_tensor", p).numel()) for p in lora)
        out["released"] = all(p.numel() == 0 for p in lora)  # outside a gather: empty
        save_file(adapter, f"{out_path}.zero{stage}.safetensors")
        out["second_adapter"] = _second_adapter(engine)
    finally:
        engine.close()
    return out


def _second_adapter(engine: Any) -> dict[str, Any]:
    """Ask for a second adapter in this job: what the engine answered and its adapters after."""
    try:
        engine.add_adapter("second", seed=3)
        error = None
    except Exception as exc:  # the error itself is what the test checks
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "adapters": engine.adapters()}


def main(spec_path: str, out_path: str) -> None:
    """Run every stage of the spec (or its LoRA run) and write the results of this rank."""
    spec = json.loads(Path(spec_path).read_text())
    if "lora" in spec["training"]:
        results = {str(stage): run_lora(spec, stage, out_path) for stage in spec["stages"]}
    else:
        results = {str(stage): run_stage(spec, stage) for stage in spec["stages"]}
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
