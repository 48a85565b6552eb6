"""The whole RL loop through ``ArcticRLClient``, run inside the client host of the cluster.

``python loop_client.py SPEC.json``: SPEC has the client config fields (``config``) and
``phase``: ``loop`` (new jobs, the whole loop, a checkpoint) or ``reconnect`` (the jobs of
``config``'s ids: step, fwd_bwd, step, load). Prints ``RESULT <json>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kit, ``support``
from support.rollouts import max_gap, rollouts

PROMPTS = ["12 + 30 =", "the sum of digits", "write a number", "count to five"]
GREEDY = {"n": 1, "max_tokens": 6, "temperature": 0.0}
SAMPLED = {"n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 0}


def loop(client) -> dict:
    """generate → log_probs → fwd_no_grad → grpo fwd_bwd → step → sync → generate."""
    first = client.generate(PROMPTS, SAMPLED)
    rows = rollouts(first["outputs"])
    batch = rows.batch()
    trainer = client.fwd_no_grad(batch)
    scored = client.log_probs(rows.prompts, rows.completions)["outputs"]
    batch["old_log_probs"] = trainer
    metrics = client.fwd_bwd(batch, loss_fn="grpo")
    step = client.step()
    sync = client.sync_weights()
    after = client.generate(PROMPTS, GREEDY)
    trainer_after = client.fwd_no_grad(batch)
    sampler_after = client.log_probs(rows.prompts, rows.completions)["outputs"]
    norms = client.weight_norm()
    saved = client.save_checkpoint()

    def gap(trainer_rows: list[list[float]], outputs: list[dict]) -> float:
        tails = [out["log_probs"] for out in outputs]
        return max_gap(trainer_rows, tails, rows.prompt_lengths)

    return {
        "weight_version_before": first["weight_version"],
        "weight_version_after": after["weight_version"],
        "sync": {k: sync[k] for k in ("weight_version", "bytes", "seconds") if k in sync},
        "gap_trainer_vs_sampler_step0": max_gap(trainer, rows.sampled, rows.prompt_lengths),
        "gap_trainer_vs_logprob_step0": gap(trainer, scored),
        "gap_trainer_vs_logprob_after_sync": gap(trainer_after, sampler_after),
        "loss": metrics["loss"],
        "global_step": step["global_step"],
        "norms": norms,
        "trainer_grad_norm": step.get("grad_norm"),
        "checkpoint": saved,
        "status": client.get_server_state(),
        "reconnect": json.loads(client.reconnect_config().model_dump_json()),
    }


def reconnect(client) -> dict:
    """A second process on the same jobs: step with nothing accumulated, train, load."""
    idle = client.step()
    metrics = client.fwd_bwd(
        {"input_ids": [[1, 5, 6, 7, 8]], "advantages": [1.0]}, loss_fn="importance_sampling"
    )
    step = client.step()
    loaded = client.load_checkpoint()
    return {
        "idle_applied": idle.get("applied"),
        "idle_step": idle["global_step"],
        "loss": metrics["loss"],
        "step": step["global_step"],
        "loaded": loaded,
    }


def main(spec_path: str) -> None:
    """Run the phase the spec names and print its RESULT line."""
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.config import ArcticRLClientConfig

    spec = json.loads(open(spec_path).read())
    config = ArcticRLClientConfig.model_validate(spec["config"])
    client = ArcticRLClient(config, progress=False)
    try:
        result = loop(client) if spec["phase"] == "loop" else reconnect(client)
    finally:
        client.close()
    print("RESULT " + json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
