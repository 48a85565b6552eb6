"""The whole RL loop through ``ArcticRLClient``, run inside the client host of the cluster.

``python loop_client.py SPEC.json``: SPEC has the client config fields (``config``) and
``phase``: ``loop`` (new jobs, the whole loop, a checkpoint) or ``reconnect`` (the jobs of
``config``'s ids: step, fwd_bwd, step, load). Prints ``RESULT <json>``.
"""

from __future__ import annotations

import json
import sys

PROMPTS = ["12 + 30 =", "the sum of digits", "write a number", "count to five"]
GREEDY = {"n": 1, "max_tokens": 6, "temperature": 0.0}
SAMPLED = {"n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 0}


def _batch(outputs: list[dict]) -> tuple[dict, list[list[float]]]:
    rows, masks, sampled = [], [], []
    for out in outputs:
        prompt = list(out["prompt_token_ids"])
        for completion in out["completions"]:
            tokens = list(completion["token_ids"])
            rows.append(prompt + tokens)
            masks.append([0] * len(prompt) + [1] * len(tokens))
            sampled.append([0.0] * len(prompt) + [float(x) for x in completion["logprobs"]])
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(rows))]
    return {"input_ids": rows, "loss_mask": masks, "advantages": advantages}, sampled


def _max_gap(a: list[list[float]], b: list[list[float]], masks: list[list[int]]) -> float:
    gap = 0.0
    for row_a, row_b, mask in zip(a, b, masks, strict=True):
        for x, y, m in zip(row_a, row_b, mask, strict=True):
            if m:
                gap = max(gap, abs(float(x) - float(y)))
    return gap


def loop(client) -> dict:
    """generate → log_probs → fwd_no_grad → grpo fwd_bwd → step → sync → generate."""
    first = client.generate(PROMPTS, SAMPLED)
    batch, sampled = _batch(first["outputs"])
    trainer = client.fwd_no_grad(batch)
    prompts = [o["prompt_token_ids"] for o in first["outputs"] for _ in o["completions"]]
    completions = [c["token_ids"] for o in first["outputs"] for c in o["completions"]]
    scored = client.log_probs(prompts, completions)["outputs"]
    batch["old_log_probs"] = trainer
    metrics = client.fwd_bwd(batch, loss_fn="grpo")
    step = client.step()
    sync = client.sync_weights()
    after = client.generate(PROMPTS, GREEDY)
    trainer_after = client.fwd_no_grad(batch)
    sampler_after = client.log_probs(prompts, completions)["outputs"]
    norms = client.weight_norm()
    saved = client.save_checkpoint()
    masks = batch["loss_mask"]

    def completion_rows(outputs: list[dict]) -> list[list[float]]:
        rows = []
        for prompt, out in zip(prompts, outputs, strict=True):
            values = out["log_probs"]
            rows.append([0.0] * len(prompt) + [float(v) for v in values])
        return rows

    return {
        "weight_version_before": first["weight_version"],
        "weight_version_after": after["weight_version"],
        "sync": {k: sync[k] for k in ("weight_version", "bytes", "seconds") if k in sync},
        "gap_trainer_vs_sampler_step0": _max_gap(trainer, sampled, masks),
        "gap_trainer_vs_logprob_step0": _max_gap(trainer, completion_rows(scored), masks),
        "gap_trainer_vs_logprob_after_sync": _max_gap(
            trainer_after, completion_rows(sampler_after), masks
        ),
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
