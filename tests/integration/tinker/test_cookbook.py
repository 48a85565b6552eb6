"""The tinker-cookbook's arithmetic RL recipe, unchanged, against our tinker server.

``python -m tinker_cookbook.recipes.math_rl.train env=arithmetic`` runs as a user would run
it (TINKER_BASE_URL / TINKER_API_KEY), on the tiny local model with the generic
``role_colon`` renderer (the recipe cannot guess a renderer for a local path), for a few
steps; it must exit 0 and log every step's metrics. The recipe asks for ``lora_rank=8``: the
server trains a LoRA adapter, so the final ``save_state`` on the server is adapter-sized.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 3
ADAPTER_STATE_BYTES = 2 * 1024 * 1024
"""A LoRA save_state of the tiny model (rank 8: 39,240 params with Adam's moments) is far
below this; a full one holds 437,120 params of weights plus moments and an HF export."""


def _state_dirs(tinker_server, log_path: Path) -> list[Path]:
    """The server's checkpoint directories of the recipe's save_state paths."""
    records = [
        json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()
    ]
    labels = {r["state_path"].rsplit("/", 1)[-1] for r in records if r.get("state_path")}
    root = tinker_server.log.parent / "server" / "checkpoints"
    # a LoRA pool's models share one checkpoint root: a tag is the model's adapter, then the label
    return [d for label in labels for d in root.glob(f"job_*/*{label}") if d.is_dir()]


def test_cookbook_arithmetic_rl_recipe_runs_and_logs_each_step(tinker_server, tmp_path):
    log_path = tmp_path / "math_rl"
    cmd = [
        sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
        "env=arithmetic",
        f"model_name={tinker_server.model}",
        "renderer_name=role_colon",
        "lora_rank=8",
        "group_size=4",
        "groups_per_batch=4",
        "max_tokens=5",
        "learning_rate=1e-4",
        f"max_steps={STEPS}",
        "eval_every=0",
        "save_every=0",
        f"log_path={log_path}",
        "behavior_if_log_dir_exists=delete",
        f"base_url={tinker_server.base_url}",
    ]  # fmt: skip
    env = {**tinker_server.env(), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    metrics = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    steps = sorted({m["step"] for m in metrics if "step" in m})
    assert steps[:STEPS] == list(range(STEPS)), (steps, tail)
    for record in metrics:
        print({k: v for k, v in record.items() if "reward" in k or "kl" in k or k == "step"})
    trained = [m for m in metrics if "optim/kl_sample_train_v1" in m]
    assert len(trained) >= STEPS, "each step trains on the trainer's log-probs"
    # the trainer's forward_backward log-probs against the sampler's, as the recipe measures
    assert all(abs(m["optim/kl_sample_train_v1"]) < 1e-2 for m in trained), trained
    states = _state_dirs(tinker_server, log_path)
    assert states, "the recipe saves its final state"
    for state in states:
        size = sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
        print(f"save_state {state.name}: {size} bytes")
        assert size < ADAPTER_STATE_BYTES, (state, size)
