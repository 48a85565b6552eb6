"""From ``generate``'s answer to a policy-gradient batch, with the sampler's log-probs kept.

``generate`` returns, for each prompt, its token ids and ``n`` completions, each with the
token ids it sampled and the sampler's log-prob of every one. ``rollout_batch`` lays them out
as the rows a ``grpo``/``ppo``/``importance_sampling``/``cispo``/``dro`` loss trains on
(prompt + completion, loss on the completion) and fills ``rollout_log_probs`` from the
sampler, so the loss measures the sampler/trainer mismatch and can correct it
(``loss_config["rollout_correction"]``) without the loop copying a single log-prob::

    from arctic_platform.rl import group_advantages, rollout_batch

    out = client.generate(prompts, {"n": 8, "max_tokens": 64, "temperature": 1.0})
    rewards = [score(c["text"]) for o in out["outputs"] for c in o["completions"]]
    batch = rollout_batch(out, group_advantages(rewards, group_size=8))
    client.fwd_bwd(batch, "grpo", {"rollout_correction": "token_tis"})
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from arctic_platform.rl.errors import InvalidRequestError


def group_advantages(
    rewards: Sequence[float], group_size: int, scale: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO's advantages: each reward minus its group's mean (consecutive groups of
    ``group_size``, as ``generate`` returns them), over the group's std plus ``eps`` when
    ``scale`` (Dr. GRPO leaves it out); a group whose rewards all agree gets zeros."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidRequestError(f"group_size must be a positive integer, got {group_size!r}")
    if len(rewards) % group_size:
        raise InvalidRequestError(
            f"{len(rewards)} rewards do not split into groups of {group_size}"
        )
    values = [float(r) for r in rewards]
    if not all(math.isfinite(r) for r in values):
        raise InvalidRequestError("rewards must be finite numbers")
    out: list[float] = []
    for start in range(0, len(values), group_size):
        group = values[start : start + group_size]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / len(group)) ** 0.5
        if std == 0:
            out.extend(0.0 for _ in group)
        else:
            out.extend((r - mean) / (std + eps) if scale else r - mean for r in group)
    return out


def rollout_batch(
    generated: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    advantages: Sequence[float],
    drop_zero_advantage: bool = False,
) -> dict[str, Any]:
    """The training batch of ``generate``'s answer (or its ``outputs``): a row per completion,
    prompt-major, ``advantages`` one per completion in the same order.

    Fields: ``input_ids`` (prompt + completion ids), ``loss_mask`` (1 on the completion),
    ``advantages`` and ``rollout_log_probs`` (0 on the prompt, the sampler's log-prob of each
    sampled token after it). ``drop_zero_advantage`` leaves out rows with advantage 0 (a tied
    group teaches a policy gradient nothing). A completion without log-probs, or with a number
    of them other than its tokens, is an ``InvalidRequestError``.
    """
    outputs = generated.get("outputs") if isinstance(generated, Mapping) else generated
    if not isinstance(outputs, Sequence):
        raise InvalidRequestError("rollout_batch takes generate's answer or its 'outputs' list")
    completions = [(out, c) for out in outputs for c in out.get("completions", [])]
    if len(advantages) != len(completions):
        raise InvalidRequestError(
            f"{len(advantages)} advantages for {len(completions)} completions: one per completion"
        )
    batch: dict[str, Any] = {
        "input_ids": [],
        "loss_mask": [],
        "advantages": [],
        "rollout_log_probs": [],
    }
    for i, ((out, completion), advantage) in enumerate(zip(completions, advantages, strict=True)):
        if drop_zero_advantage and advantage == 0:
            continue
        prompt = [int(t) for t in out["prompt_token_ids"]]
        tokens = [int(t) for t in completion["token_ids"]]
        logprobs = completion.get("logprobs")
        if logprobs is None or len(logprobs) != len(tokens):
            have = "no" if logprobs is None else str(len(logprobs))
            raise InvalidRequestError(
                f"completion {i} has {len(tokens)} tokens and {have} log-probs: rollout_batch "
                "needs the sampler's log-prob of every sampled token (generate returns them)"
            )
        batch["input_ids"].append(prompt + tokens)
        batch["loss_mask"].append([0] * len(prompt) + [1] * len(tokens))
        batch["advantages"].append(float(advantage))
        batch["rollout_log_probs"].append([0.0] * len(prompt) + [float(x) for x in logprobs])
    return batch
