"""Many LoRA adapters on one training engine: one live in the model, the others parked on the host.

Every adapter of a bank has the same signature (rank, alpha, target modules), so they all fit
the one set of LoRA parameters the model holds. Switching adapters copies the live adapter's
training state out (weights, pending gradients, AdamW moments and step, the optimizer's
hyper-parameters, the engine's counters) and the next one's in; the parameter objects never
change, so the optimizer and DeepSpeed keep working on the same tensors. This is the ZeRO-0
case (plain tensors everywhere); a sharded optimizer would need DeepSpeed's ``safe_*`` calls.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import DEFAULT_ADAPTER, METRICS, InvalidRequestError, NotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import torch

HYPER_KEYS = ("lr", "betas", "eps", "weight_decay")
"""The optimizer settings a Tinker model may set on its own steps, kept per adapter."""


class AdapterNotFoundError(NotFoundError):
    """A training request named an adapter this training job does not hold."""

    remedy = "Add the adapter first (a Tinker model does it on create_model), or fix the name."


@dataclass
class ParkedAdapter:
    """One adapter's training state, kept on the host while another adapter is live."""

    weights: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    moments: dict[str, dict[str, Any]] = field(default_factory=dict)
    hyper: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Host bytes this parked state holds."""
        tensors = [*self.weights.values(), *self.grads.values()]
        tensors += [v for state in self.moments.values() for v in state.values() if _is_tensor(v)]
        return sum(int(t.numel() * t.element_size()) for t in tensors)


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def fresh_lora_weights(params: Mapping[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """A new adapter's weights: ``lora_A`` as peft draws it (Kaiming-uniform), ``lora_B`` zero,
    so a new adapter starts out equal to the base model."""
    import torch

    generator = torch.Generator().manual_seed(int(seed))
    out: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        tensor = torch.zeros(tuple(param.shape), dtype=param.dtype)
        if ".lora_A." in name:
            fan_in = tensor.shape[1] if tensor.dim() > 1 else tensor.shape[0]
            bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_ with a=sqrt(5), as nn.Linear
            tensor.uniform_(-bound, bound, generator=generator)
        out[name] = tensor
    return out


class AdapterBank:
    """Adapters sharing the model's LoRA parameters: ``live`` is in them, the rest parked.

    ``params``: the model's LoRA parameters by name (the same objects the optimizer holds).
    ``counters``/``set_counters``: read and restore the engine's per-adapter counters (e.g.
    DeepSpeed's step count), kept with each parked adapter.
    """

    def __init__(
        self,
        params: Mapping[str, torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        *,
        counters: Callable[[], dict[str, Any]] = dict,
        set_counters: Callable[[dict[str, Any]], None] = lambda _: None,
        live: str = DEFAULT_ADAPTER,
    ) -> None:
        self.params = dict(params)
        self.optimizer = optimizer
        self._counters = counters
        self._set_counters = set_counters
        self.live: str | None = live
        self.parked: dict[str, ParkedAdapter] = {}
        self._fresh_counters = copy.deepcopy(counters())
        self._report()

    def _report(self, swapped: bool = False) -> None:
        """The bank's adapters live and parked, and a swap, as metrics (rank 0 only: every
        rank holds the same bank)."""
        if os.environ.get("RANK", "0") != "0":
            return
        METRICS.set("arctic_rl_lora_adapters", 1.0 if self.live else 0.0, state="live")
        METRICS.set("arctic_rl_lora_adapters", float(len(self.parked)), state="parked")
        if swapped:
            METRICS.inc("arctic_rl_lora_swaps_total")

    def names(self) -> list[str]:
        """Every adapter of the bank, the live one first."""
        return ([self.live] if self.live is not None else []) + sorted(self.parked)

    def __contains__(self, name: object) -> bool:
        return name == self.live or name in self.parked

    def add(self, name: str, seed: int = 0, weights: Mapping[str, Any] | None = None) -> None:
        """A new adapter, parked: ``weights`` given, or fresh ones drawn with ``seed``."""
        if not isinstance(name, str) or not name or "@" in name:
            raise InvalidRequestError(f"adapter name {name!r} must be a non-empty name without '@'")
        if name in self:
            raise InvalidRequestError(f"adapter {name!r} already exists in this training job")
        start = dict(weights) if weights is not None else fresh_lora_weights(self.params, seed)
        missing = sorted(set(self.params) - set(start))
        if missing:
            raise InvalidRequestError(f"adapter {name!r} lacks weights {missing[:3]}")
        self.parked[name] = ParkedAdapter(
            weights={k: start[k].detach().cpu().clone() for k in self.params},
            hyper=self._hyper(),
            counters=copy.deepcopy(self._fresh_counters),
        )
        self._report()

    def remove(self, name: str) -> None:
        """Forget an adapter; removing the live one leaves the model's LoRA weights unowned."""
        self._known(name)
        if name == self.live:
            self.live = None
        else:
            del self.parked[name]
        self._report()

    def use(self, name: str) -> bool:
        """Make ``name`` the live adapter; returns whether anything was swapped."""
        self._known(name)
        if name == self.live:
            return False
        if self.live is not None:
            self.parked[self.live] = self._capture()
        self._restore(self.parked.pop(name))
        self.live = name
        self._report(swapped=True)
        return True

    def parked_bytes(self) -> int:
        """Host bytes the parked adapters hold."""
        return sum(p.nbytes() for p in self.parked.values())

    def _known(self, name: str) -> None:
        if name not in self:
            raise AdapterNotFoundError(
                f"adapter {name!r} is not in this training job (it holds {self.names()})"
            )

    def _hyper(self) -> list[dict[str, Any]]:
        groups = self.optimizer.param_groups
        return [{k: copy.deepcopy(g[k]) for k in HYPER_KEYS if k in g} for g in groups]

    def _capture(self) -> ParkedAdapter:
        """The live adapter's state, copied to the host."""
        weights, grads, moments = {}, {}, {}
        for name, param in self.params.items():
            weights[name] = param.detach().cpu().clone()
            if param.grad is not None:
                grads[name] = param.grad.detach().cpu().clone()
            state = self.optimizer.state.get(param)
            if state:
                moments[name] = {
                    k: v.detach().cpu().clone() if _is_tensor(v) else copy.deepcopy(v)
                    for k, v in state.items()
                }
        return ParkedAdapter(weights, grads, moments, self._hyper(), self._counters())

    def _restore(self, parked: ParkedAdapter) -> None:
        """Copy a parked adapter into the live parameters, gradients and optimizer state."""
        import torch

        with torch.no_grad():
            for name, param in self.params.items():
                param.data.copy_(parked.weights[name].to(param.device, param.dtype))
                grad = parked.grads.get(name)
                param.grad = None if grad is None else grad.to(param.device, param.dtype)
                state = parked.moments.get(name)
                if state is None:
                    self.optimizer.state.pop(param, None)
                else:
                    self.optimizer.state[param] = {
                        k: v.to(param.device) if _is_tensor(v) and v.dim() else v
                        for k, v in state.items()
                    }
        for group, hyper in zip(self.optimizer.param_groups, parked.hyper, strict=False):
            group.update(copy.deepcopy(hyper))
        self._set_counters(copy.deepcopy(parked.counters))
