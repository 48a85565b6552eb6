"""A Tinker asample request read into our ``generate``: its prompt tokens, its sampling
parameters, and the item that waits for its share of a shared ``generate``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arctic_platform.rl.api import InvalidRequestError
from arctic_rl_tinker import convert
from arctic_rl_tinker.futures import Future, Outcome
from arctic_rl_tinker.records import Sampler, StaleWeightsError

DEFAULT_MAX_TOKENS = 128
"""Tokens sampled when a request leaves ``max_tokens`` unset."""


@dataclass
class SampleItem:
    """One asample request waiting for its share of a ``generate``."""

    sampler: Sampler
    prompt: list[int]
    future: Future
    want_prompt: bool
    last_n: int | None

    def stale(self, serving: Any) -> StaleWeightsError:
        """The error for a sampler whose job now serves newer weights."""
        sampler = self.sampler
        return StaleWeightsError(
            f"sampler {sampler.sampler_id} was opened on weight version {sampler.version} "
            f"({sampler.model_path or sampler.base_model}); the sampling job now serves "
            f"version {serving}: open a sampler on the newer save_weights_for_sampler path"
        )

    def outcome(self, output: dict[str, Any]) -> Outcome:
        """This prompt's completions (and prompt log-probs, when asked) as a SampleResponse."""
        prompt_lps = output.get("prompt_logprobs") if self.want_prompt else None
        if prompt_lps is not None and self.last_n is not None:
            keep = int(self.last_n)
            prompt_lps = [None] * (len(prompt_lps) - keep) + list(prompt_lps[-keep:])
        return Outcome(proto=convert.sample_output(output["completions"], prompt_lps))


def prompt_tokens(prompt: Any) -> list[int]:
    """The token ids of a JSON ModelInput (encoded_text chunks only)."""
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks"), list):
        raise InvalidRequestError("prompt must be a ModelInput: {'chunks': [...]}")
    tokens: list[int] = []
    for i, chunk in enumerate(prompt["chunks"]):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise InvalidRequestError(f"prompt chunk {i}: only encoded_text chunks are supported")
        values = chunk.get("tokens")
        if not isinstance(values, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in values
        ):
            raise InvalidRequestError(f"prompt chunk {i}: tokens must be non-negative integers")
        tokens.extend(values)
    if not tokens:
        raise InvalidRequestError("prompt has no tokens")
    return tokens


def sampling_params(given: dict[str, Any]) -> dict[str, Any]:
    """Tinker's SamplingParams as our generate's ``sampling_params``."""
    if not isinstance(given, dict):
        raise InvalidRequestError("sampling_params must be an object")
    out: dict[str, Any] = {"max_tokens": given.get("max_tokens") or DEFAULT_MAX_TOKENS}
    for key in ("seed", "temperature", "top_p"):
        if given.get(key) is not None:
            out[key] = given[key]
    if given.get("top_k") is not None:
        out["top_k"] = given["top_k"]
    stop = given.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif isinstance(stop, list):
        if not stop:
            out["ignore_eos"] = True  # Tinker: [] disables every stop, EOS included
        elif all(isinstance(s, str) for s in stop):
            out["stop"] = list(stop)
        elif all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            out["stop_token_ids"] = list(stop)
        else:
            raise InvalidRequestError("sampling_params.stop mixes strings and token ids")
    elif stop is not None:
        raise InvalidRequestError("sampling_params.stop must be a string or a list")
    return out


__all__ = ["DEFAULT_MAX_TOKENS", "SampleItem", "prompt_tokens", "sampling_params"]
