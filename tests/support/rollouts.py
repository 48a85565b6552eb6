"""Rollouts (``generate`` outputs) as training rows with loss masks, and the post-sync check
that trainer, sampler and log-prob job score the same tokens alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Rollouts:
    """One row per completion: prompt + completion ids, a mask over the completion, the
    prompt's length and the sampler's log-probs of the completion tokens."""

    input_ids: list[list[int]] = field(default_factory=list)
    loss_mask: list[list[int]] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    sampled: list[list[float]] = field(default_factory=list)

    @property
    def prompts(self) -> list[list[int]]:
        """Each row's prompt ids."""
        return [row[:p] for row, p in zip(self.input_ids, self.prompt_lengths, strict=True)]

    @property
    def completions(self) -> list[list[int]]:
        """Each row's completion ids."""
        return [row[p:] for row, p in zip(self.input_ids, self.prompt_lengths, strict=True)]

    def rollout_log_probs(self) -> list[list[float]]:
        """The sampler's log-probs as a per-token batch field (0.0 over each prompt)."""
        return [
            [0.0] * p + list(values)
            for p, values in zip(self.prompt_lengths, self.sampled, strict=True)
        ]

    def batch(self, **extra: Any) -> dict[str, Any]:
        """A ``fwd_bwd`` batch of the rows, masks and alternating advantages (``extra`` added)."""
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(self.input_ids))]
        return {
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "advantages": advantages,
            **extra,
        }


def rollouts(outputs: list[dict[str, Any]]) -> Rollouts:
    """The rows of a ``generate`` answer's ``outputs``: prompt by prompt, completion by
    completion."""
    out = Rollouts()
    for prompt_output in outputs:
        prompt = list(prompt_output["prompt_token_ids"])
        for completion in prompt_output["completions"]:
            tokens = list(completion["token_ids"])
            out.input_ids.append(prompt + tokens)
            out.loss_mask.append([0] * len(prompt) + [1] * len(tokens))
            out.prompt_lengths.append(len(prompt))
            out.sampled.append([float(x) for x in completion.get("logprobs") or []])
    return out


def max_gap(rows: list[list[float]], tails: list[list[float]], prompt_lengths: list[int]) -> float:
    """The largest |row[p:] - tail| over all rows: full-row scores (the trainer's) against
    completion-only scores (sampler, log-prob job)."""
    gap = 0.0
    for row, values, p in zip(rows, tails, prompt_lengths, strict=True):
        assert len(row) - p == len(values), (len(row), p, len(values))
        gap = max([gap, *(abs(float(a) - float(b)) for a, b in zip(row[p:], values, strict=True))])
    return gap


def assert_log_prob_job_agrees(
    client: Any, rows: Rollouts, tolerance: float = 1e-3
) -> list[list[float]]:
    """The log-prob job's scores of ``rows`` match the trainer's ``fwd_no_grad`` within
    ``tolerance`` nats (strictly); returns the trainer's full-row scores."""
    lp = client.log_probs(rows.prompts, rows.completions)
    trainer = client.fwd_no_grad({"input_ids": rows.input_ids})
    scored = [out["log_probs"] for out in lp["outputs"]]
    assert max_gap(trainer, scored, rows.prompt_lengths) < tolerance
    return trainer


def assert_scores_agree(
    client: Any, outputs: list[dict[str, Any]], tolerance: float = 1e-3, log_probs: bool = True
) -> Rollouts:
    """The trainer's ``fwd_no_grad`` of each sampled row matches the sampler's log-probs (and,
    with ``log_probs``, the log-prob job's) within ``tolerance`` nats; after a sync this shows
    every job holds the same weights. Returns the rows."""
    rows = rollouts(outputs)
    trainer = client.fwd_no_grad({"input_ids": rows.input_ids})
    gap = max_gap(trainer, rows.sampled, rows.prompt_lengths)
    assert gap <= tolerance, f"trainer vs sampler: {gap}"
    if log_probs:
        scored = client.log_probs(rows.prompts, rows.completions)["outputs"]
        tails = [out["log_probs"] for out in scored]
        gap = max_gap(trainer, tails, rows.prompt_lengths)
        assert gap <= tolerance, f"trainer vs log-prob job: {gap}"
    return rows


# Fixed token rows every job scores the same way: prompt-free, so each token after the first
# is scored (tokens of the tiny model's vocabulary; no generation involved).
FIXED_ROWS = [[1, 5, 6, 7, 8, 9, 10], [1, 12, 13, 14, 15], [2, 30, 31, 32, 33, 34]]


def fixed_row_scores(client: Any, jobs: tuple[str, ...] = ("training", "sampling", "log_prob"),
                     **served: Any) -> dict[str, list[list[float]]]:  # fmt: skip
    """Each job's log-probs of every token after the first of ``FIXED_ROWS``: the trainer's
    ``fwd_no_grad``, the sampler's ``prompt_logprobs``, the log-prob job's ``log_probs``
    (``served``: an adapter and version for the two vLLM jobs)."""
    scores: dict[str, list[list[float]]] = {}
    if "training" in jobs:
        trainer = client.fwd_no_grad({"input_ids": FIXED_ROWS})
        scores["training"] = [[float(x) for x in row[1:]] for row in trainer]
    if "sampling" in jobs:
        params = {"n": 1, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": True}
        out = client.generate(FIXED_ROWS, params, **served)["outputs"]
        scores["sampling"] = [[float(x) for x in o["prompt_logprobs"][1:]] for o in out]
    if "log_prob" in jobs:
        prompts = [row[:1] for row in FIXED_ROWS]
        completions = [row[1:] for row in FIXED_ROWS]
        lp = client.log_probs(prompts, completions, **served)["outputs"]
        scores["log_prob"] = [[float(x) for x in o["log_probs"]] for o in lp]
    return scores


def score_gap(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest |a - b| over the tokens of two jobs' ``fixed_row_scores``."""
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
