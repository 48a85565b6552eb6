"""The settings every demo task shares (``LoopSettings``): what the loop itself reads (model
size, transport, seed, output directory, trackers, ...) and how the command's flags become a
task's settings. Each task's settings subclass it with its own fields and defaults.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from arctic_rl_demo.run_log import check_report_to
from arctic_rl_demo.runner import MODEL_SIZES

CORRECTION_CHOICES = (
    "none",
    "bypass",
    "token_tis",
    "seq_tis",
    "icepop",
    "seq_mask",
    "geo_rs",
    "seq_tis_rs",
    "token_tis_veto",
    "bypass_k3_rs",
)
"""What ``--correction`` takes: ``none`` (the trainer's own log-probs are the old policy) or a
rollout-correction preset of the losses."""


def run_dir(prefix: str) -> Callable[[], Path]:
    """A default factory for ``output_dir``: ``runs/<prefix>-<time>``."""
    return lambda: Path("runs") / time.strftime(f"{prefix}-%Y%m%d-%H%M%S")


@dataclass
class LoopSettings:
    """What the loop reads of every task's settings (``steps`` counts GRPO steps, ``sft_steps``
    warm-start steps; each task sets its own defaults for these four)."""

    steps: int
    sft_steps: int
    eval_every: int
    learning_rate: float
    sft_batch_size: int = 32
    sft_learning_rate: float = 2e-3
    correction: str = "bypass"  # a rollout-correction preset, or "none"
    model_size: str = "tiny"
    transport: str = "http"
    colocate: bool = False
    output_dir: Path = field(default_factory=run_dir("demo"))
    seed: int = 0
    quiet: bool = False
    report_to: tuple[str, ...] = ()  # experiment trackers (--report-to), beside metrics.jsonl
    demo_mistakes: float = 0.0
    """The share of warm-start demonstrations that show a demonstrator's habit the exact-match
    reward refuses (each task says which): the warm start imitates it and only GRPO removes
    it, so what GRPO adds is seen apart from what the warm start taught."""

    def __post_init__(self) -> None:
        self.report_to = check_report_to(self.report_to)
        if self.model_size not in MODEL_SIZES:
            raise ValueError(f"model_size {self.model_size!r} is not one of {list(MODEL_SIZES)}")
        if not 0.0 <= self.demo_mistakes < 1.0:
            raise ValueError(f"demo_mistakes={self.demo_mistakes} must be in [0, 1)")
        if self.correction not in CORRECTION_CHOICES:
            raise ValueError(
                f"correction {self.correction!r} is not one of {list(CORRECTION_CHOICES)}"
            )

    @property
    def warm_steps(self) -> int:
        """Every warm-start step the run takes (the progress bar's and trackers' count)."""
        return self.sft_steps

    @classmethod
    def from_flags(cls, flags: dict[str, Any]) -> Self:
        """The settings from the command's parsed flags: each one given (not None) that names
        a field sets it; the others are not this task's and stay unset."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in flags.items() if k in names and v is not None}
        if "output_dir" in given:
            given["output_dir"] = Path(given["output_dir"])
        return cls(**given)
