"""Built-in losses for ``fwd_bwd``, registered as loss plugins by core itself."""

from __future__ import annotations

from collections.abc import Iterator

from arctic_platform.rl.plugins.hookspecs import hookimpl
from arctic_platform.rl.plugins.specs import LossSpec, not_implemented_yet

BUILTIN_LOSSES = ("grpo", "ppo", "importance_sampling", "cross_entropy")


@hookimpl
def arctic_rl_register_losses() -> Iterator[LossSpec]:
    """grpo, ppo, importance_sampling and cross_entropy."""
    for name in BUILTIN_LOSSES:
        yield LossSpec(name=name, factory=not_implemented_yet(f"the {name!r} loss"))
