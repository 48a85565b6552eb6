"""A complete GRPO loop on the public client API: the script to copy into your own project.

Run it with a local model directory (``arctic_platform.rl.testing.build_tiny_model`` makes
one) or any Hugging Face model id you have on disk::

    python examples/grpo_loop.py --model ./my-model --steps 20

The task: "digits summing to N:" — the reward is computed exactly from the text (a share for
answering in digits, most of it for how close their sum is to N). Each step prints what you
watch in a real run: the mean reward of the step's samples, the held-out score (greedy
answers to prompts training never draws) and the weight version the sampler serves. With
``--report-to tensorboard,mlflow,wandb`` the same figures, and everything the platform's answers
carry (loss, mismatch, grad norm, tokens, queue and compute seconds, sync bytes), go to those
experiment trackers under ``--log-dir``.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from arctic_platform.rl import (
    ArcticRLClient,
    ArcticRLClientConfig,
    RunTracker,
    group_advantages,
    rollout_batch,
)

HELD_OUT = [4, 7, 11, 15]  # targets never drawn for training (see train_targets)


def reward(text: str, target: int) -> float:
    """1.0 for digits summing exactly to ``target``; partial credit for digits and closeness."""
    digits = [int(c) for c in text if c.isdigit()]
    chars = [c for c in text if not c.isspace()]
    if not digits:
        return 0.0
    closeness = max(0.0, 1.0 - abs(sum(digits) - target) / target)
    return 0.3 * len(digits) / len(chars) + 0.7 * closeness


def train_targets(rng: random.Random, count: int) -> list[int]:
    """Targets for one training step, held-out targets excluded."""
    pool = [t for t in range(3, 19) if t not in HELD_OUT]
    return [rng.choice(pool) for _ in range(count)]


def held_out_score(client: ArcticRLClient) -> float:
    """Mean reward of greedy answers to the held-out prompts."""
    prompts = [f"digits summing to {t}:" for t in HELD_OUT]
    out = client.generate(prompts, {"n": 1, "max_tokens": 6, "temperature": 0.0})
    texts = [o["completions"][0]["text"] for o in out["outputs"]]
    return sum(reward(text, t) for text, t in zip(texts, HELD_OUT, strict=True)) / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local model directory or HF id")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=7000, help="the local server's port")
    parser.add_argument(
        "--report-to",
        default="none",
        help="experiment trackers, comma-separated: tensorboard, mlflow, wandb (default none)",
    )
    parser.add_argument("--log-dir", default="runs/grpo-loop", help="where the trackers write")
    args = parser.parse_args()

    config = ArcticRLClientConfig(
        model_name=args.model,
        host="127.0.0.1",
        port=args.port,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=0,  # the trainer's log-probs are the old policy; the sampler's measure
        # the mismatch (``mismatch_k3`` etc. in fwd_bwd's answer)
        training_config={"optimizer": {"lr": args.lr}},
    )
    rng = random.Random(args.seed)
    tracker = RunTracker(args.report_to, args.log_dir, project="grpo-loop", config=vars(args))
    with ArcticRLClient(config) as client, tracker:
        print(f"before training: held-out {held_out_score(client):.3f}", flush=True)
        for step in range(1, args.steps + 1):
            targets = train_targets(rng, args.prompts)
            prompts = [f"digits summing to {t}:" for t in targets]
            out = client.generate(prompts, {"n": args.group, "max_tokens": 6, "temperature": 1.0})
            rewards = [
                reward(c["text"], target)
                for target, o in zip(targets, out["outputs"], strict=True)
                for c in o["completions"]
            ]
            # rows of prompt + completion, loss on the completion, and the sampler's own
            # log-probs as rollout_log_probs (the loss reports the mismatch against them)
            batch = rollout_batch(out, group_advantages(rewards, group_size=args.group))
            trained: dict[str, Any] = {}
            stepped: dict[str, Any] = {}
            if any(batch["advantages"]):  # a step where every group tied teaches nothing
                trained = client.fwd_bwd(batch, loss_fn="grpo")
                stepped = client.step()
            synced = client.sync_weights()
            mean_reward = sum(rewards) / len(rewards)
            held_out = held_out_score(client)
            print(
                f"step {step}: reward {mean_reward:.3f}  held-out {held_out:.3f}"
                f"  weight_version {synced['weight_version']}",
                flush=True,
            )
            # our answers as they came (texts and token lists are left out), and the loop's own
            tracker.log(
                {"reward_mean": mean_reward, "held_out": held_out, "generate": out,
                 "train": trained, "optim": stepped, "sync": synced},
                step=step,
            )  # fmt: skip


if __name__ == "__main__":
    main()
