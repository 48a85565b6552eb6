"""Many named LoRA adapters in one DeepSpeed training engine: the ``adapter=`` keyword.

A LoRA engine starts with one adapter, ``DEFAULT_ADAPTER``. ``add_adapter`` adds more, which
share the model's LoRA parameters through an ``AdapterBank``: the adapter a call names is
made live first (its weights, pending gradients, AdamW state, step counters and learning-rate
schedule swapped in), the others wait on the host. Checkpoints hold the live adapter, so
``save_checkpoint(..., adapter=a)`` saves ``a``'s training state and ``load_checkpoint(...,
adapter=a)`` restores into ``a``. ZeRO-0 with our own AdamW only (plain tensors everywhere).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import DEFAULT_ADAPTER, EngineConfigError, InvalidRequestError
from arctic_rl_engines import ds_lora
from arctic_rl_engines.ds_adapter_bank import AdapterBank, AdapterNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import torch

_ENGINE_COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


def export_name(param_name: str, adapter: str = "default") -> str:
    """A LoRA parameter's export name (peft's adapter name taken out)."""
    return param_name.replace(f".{adapter}.weight", ".weight")


class AdapterHost:
    """Mixin of ``DeepSpeedTrainingEngine``: named adapters selected per call."""

    _lora: Any
    _engine: Any
    _accumulated: bool
    _discard_gradients: Any
    setup: Any
    config: Any
    _bank: AdapterBank | None = None

    def adapters(self) -> list[str]:
        """The adapters this engine trains, the live one first (``[]`` in full mode)."""
        if self._lora is None:
            return []
        return self._bank.names() if self._bank is not None else [DEFAULT_ADAPTER]

    def add_adapter(self, name: str, seed: int | None = None) -> dict[str, Any]:
        """A new adapter ``name`` starting as the base (``lora_B`` = 0, ``lora_A`` from
        ``seed``, else the job's ``lora.seed`` or seed), with fresh optimizer state."""
        from arctic_rl_engines.lora_names import bad_adapter_name

        problem = bad_adapter_name(name)
        if problem:
            raise InvalidRequestError(problem)
        bank = self._adapter_bank()
        if seed is None:
            seed = self._lora.seed if self._lora.seed is not None else self.config.seed
        bank.add(name, seed=int(seed))
        fresh = bank.parked[name]
        fresh.counters = self._fresh_counters()
        scheduler = fresh.counters["scheduler"]
        if scheduler is not None:  # the schedule's first rate, not the live adapter's current
            for hyper, lr in zip(fresh.hyper, scheduler["_last_lr"], strict=False):
                hyper["lr"] = lr
        return {"adapter": name, "adapters": bank.names(), "parked_bytes": bank.parked_bytes()}

    def remove_adapter(self, name: str) -> dict[str, Any]:
        """Forget adapter ``name`` with its optimizer state and any gradients no step applied
        (they belong to nothing else); the job's last adapter stays."""
        bank = self._adapter_bank()
        if name == bank.live and len(bank.names()) == 1:
            raise InvalidRequestError(f"adapter {name!r} is this job's last adapter")
        if name == bank.live and self._accumulated:
            self._discard_gradients()
        bank.remove(name)
        if bank.live is None:  # the model's LoRA weights go to the next adapter
            bank.use(bank.names()[0])
        return {"adapter": name, "adapters": bank.names(), "parked_bytes": bank.parked_bytes()}

    def _select(self, adapter: str | None) -> None:
        """Make ``adapter`` (None: the live one) live before a call works on the model."""
        if adapter is None:
            return
        if self._lora is None:
            raise InvalidRequestError(
                f"adapter={adapter!r}: this training job trains full weights, not adapters"
            )
        if self._bank is None:
            if adapter != DEFAULT_ADAPTER:
                raise AdapterNotFoundError(
                    f"adapter {adapter!r} is not in this training job (it holds "
                    f"{[DEFAULT_ADAPTER]})"
                )
            return
        self._bank.use(adapter)

    def _adapter_weights(self, adapter: str | None) -> dict[str, torch.Tensor] | None:
        """A parked adapter's export tensors (no swap), or None when ``adapter`` is live."""
        bank = self._bank
        if adapter is None or bank is None or adapter == bank.live:
            self._select(adapter)
            return None
        if adapter not in bank:
            self._select(adapter)  # raises AdapterNotFoundError naming the adapters
        parked = bank.parked[adapter]
        return {export_name(n): t.clone() for n, t in parked.weights.items()}

    def _adapter_bank(self) -> AdapterBank:
        import torch

        if self._lora is None:
            raise InvalidRequestError("this training job trains full weights, not adapters")
        if self._bank is not None:
            return self._bank
        optimizer = self._engine.optimizer
        own = isinstance(optimizer, torch.optim.AdamW) and self.setup.dtype == "float32"
        if self.setup.zero_stage != 0 or not own:
            raise EngineConfigError(
                "many adapters in one training job need ZeRO stage 0 in float32 with the "
                f"engine's own AdamW (this job: ZeRO {self.setup.zero_stage}, "
                f"{self.setup.dtype}, optimizer {type(optimizer).__name__})"
            )
        params = dict(ds_lora.lora_parameters(self._engine.module))
        self._bank = AdapterBank(
            params, optimizer, counters=self._counters, set_counters=self._set_counters
        )
        return self._bank

    def _counters(self) -> dict[str, Any]:
        """The engine's per-adapter progress: DeepSpeed's step counters, the learning-rate
        schedule and whether gradients wait for a step."""
        engine = self._engine
        out: dict[str, Any] = {k: getattr(engine, k) for k in _ENGINE_COUNTERS}
        scheduler = engine.lr_scheduler
        out["scheduler"] = copy.deepcopy(scheduler.state_dict()) if scheduler else None
        out["accumulated"] = self._accumulated
        return out

    def _fresh_counters(self) -> dict[str, Any]:
        """``_counters`` of an adapter that has taken no step."""
        out: dict[str, Any] = dict.fromkeys(_ENGINE_COUNTERS, 0)
        out["accumulated"] = False
        out["scheduler"] = None
        scheduler = self._engine.lr_scheduler
        if scheduler is not None:
            state = copy.deepcopy(scheduler.state_dict())
            state.update(last_epoch=0, _step_count=1)
            lambdas = getattr(scheduler, "lr_lambdas", None) or [lambda _: 1.0] * len(
                state["base_lrs"]
            )
            rates = zip(state["base_lrs"], lambdas, strict=True)
            state["_last_lr"] = [base * fn(0) for base, fn in rates]
            out["scheduler"] = state
        return out

    def _set_counters(self, counters: dict[str, Any]) -> None:
        engine = self._engine
        for key in _ENGINE_COUNTERS:
            setattr(engine, key, counters[key])
        if engine.lr_scheduler is not None and counters["scheduler"] is not None:
            engine.lr_scheduler.load_state_dict(counters["scheduler"])
        self._accumulated = bool(counters["accumulated"])
