"""A complete GRPO loop on the public client API: the script to copy into your own project.

Run it with a local model directory (``arctic_platform.rl.testing.build_tiny_model`` makes
one) or any Hugging Face model id you have on disk::

    python examples/grpo_loop.py --model ./my-model --steps 20

The task: "digits summing to N:" — the reward is computed exactly from the text.
"""

from __future__ import annotations

import argparse
import random

from arctic_platform.rl import ArcticRLClient, ArcticRLClientConfig


def reward(text: str, target: int) -> float:
    digits = [int(c) for c in text if c.isdigit()]
    chars = [c for c in text if not c.isspace()]
    if not digits:
        return 0.0
    closeness = max(0.0, 1.0 - abs(sum(digits) - target) / target)
    return 0.3 * len(digits) / len(chars) + 0.7 * closeness


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    args = parser.parse_args()

    config = ArcticRLClientConfig(
        model_name=args.model,
        host="127.0.0.1",
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
        training_config={"optimizer": {"lr": 2e-3}},
    )
    rng = random.Random(0)
    with ArcticRLClient(config) as client:
        for step in range(args.steps):
            targets = [rng.randint(3, 18) for _ in range(8)]
            prompts = [f"digits summing to {t}:" for t in targets]
            out = client.generate(prompts, {"n": args.group, "max_tokens": 6, "temperature": 1.0})

            rows, masks, advantages, prompt_ids, completion_ids = [], [], [], [], []
            for target, o in zip(targets, out["outputs"], strict=True):
                rewards = [reward(c["text"], target) for c in o["completions"]]
                mean = sum(rewards) / len(rewards)
                std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
                for c, r in zip(o["completions"], rewards, strict=True):
                    rows.append(o["prompt_token_ids"] + c["token_ids"])
                    masks.append([0] * len(o["prompt_token_ids"]) + [1] * len(c["token_ids"]))
                    advantages.append((r - mean) / (std + 1e-6) if std > 0 else 0.0)
                    prompt_ids.append(o["prompt_token_ids"])
                    completion_ids.append(c["token_ids"])

            old = client.log_probs(prompt_ids, completion_ids)["outputs"]
            old_rows = [
                [0.0] * len(p) + o["log_probs"] for p, o in zip(prompt_ids, old, strict=True)
            ]
            if any(advantages):
                metrics = client.fwd_bwd(
                    {
                        "input_ids": rows,
                        "loss_mask": masks,
                        "advantages": advantages,
                        "old_log_probs": old_rows,
                    },
                    loss_fn="grpo",
                )
            else:
                metrics = {"loss": 0.0}
            client.step()
            client.sync_weights()
            print(f"step {step}: loss {metrics['loss']:.4f}")


if __name__ == "__main__":
    main()
