"""What the demo tasks share: instances keyed by a digit string, a fixed held-out set drawn
from its own seed, and training draws that never hit a held-out key (``HeldOutDigits``)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class HeldOutDigits(ABC):
    """Keys of ``digits`` digits; ``heldout_size`` of them (drawn from ``heldout_seed``, at most a
    quarter of all keys) are held out. A task subclasses it and says what a key's pair is."""

    digits: int = 4
    heldout_size: int = 128
    heldout_seed: int = 12345

    keys_are: ClassVar[str] = "keys"  # what the error messages call the keys

    def __post_init__(self) -> None:
        if self.digits < 2:
            raise ValueError(f"digits must be at least 2, got {self.digits}")
        if not 0 < self.heldout_size <= 10**self.digits // 4:
            raise ValueError(
                f"heldout_size={self.heldout_size} must be in [1, {10**self.digits // 4}] "
                f"for {self.digits}-digit {self.keys_are} (at most a quarter of them)"
            )

    def draw(self, rng: random.Random) -> str:
        """A random digit string of ``digits`` characters."""
        return "".join(rng.choice("0123456789") for _ in range(self.digits))

    @abstractmethod
    def heldout_pair(self, rng: random.Random) -> tuple[str, str]:
        """One held-out draw: a key and its answer."""

    @cached_property
    def heldout_answers(self) -> dict[str, str]:
        """The held-out keys, distinct, in a stable order, each with its fixed answer."""
        rng = random.Random(self.heldout_seed)
        seen: dict[str, str] = {}
        while len(seen) < self.heldout_size:
            key, answer = self.heldout_pair(rng)
            seen.setdefault(key, answer)
        return seen

    def training(self, count: int, rng: random.Random, make: Callable[[str], T]) -> list[T]:
        """``count`` training instances, ``make(key)`` each, from keys never held out."""
        out: list[T] = []
        while len(out) < count:
            key = self.draw(rng)
            if key not in self.heldout_answers:
                out.append(make(key))
        return out
