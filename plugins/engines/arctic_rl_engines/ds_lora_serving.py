"""Named, versioned LoRA adapters served by the DeepSpeed log-prob engine (LoRA mode).

Each ``load_adapter(name, version, weights)`` keeps the adapter's tensors on the host; a call
naming ``adapter``/``adapter_version`` first copies that version into the model's LoRA
parameters (a few hundred KB; collective under ZeRO-3, like every call of the job), so
versions never mix. ``adapter=None`` is ``DEFAULT_ADAPTER`` at its newest version, or the base
before any adapter arrived; ``"base"`` is the base (the adapter switched off).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import DEFAULT_ADAPTER, InvalidRequestError
from arctic_rl_engines import ds_lora, ds_model
from arctic_rl_engines.ds_adapter_bank import AdapterNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import torch

BASE_ADAPTER = "base"
MAX_VERSIONS = 16  # versions kept per adapter (vLLM's max_cpu_loras default here); oldest go


class AdapterServing:
    """Mixin of ``DeepSpeedLogProbEngine``: ``load_adapter``, ``adapters``, ``remove_adapter``."""

    _lora: Any
    _model: Any

    def _serving_start(self) -> None:
        self._served: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
        self._live: tuple[str, int] | None = None  # what the LoRA parameters hold now

    def load_adapter(
        self, name: str, version: int, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> dict[str, Any]:
        """Keep ``weights`` (exactly the adapter's tensors) as ``name`` at ``version``."""
        start = time.monotonic()
        if self._lora is None:
            raise InvalidRequestError(
                "this log-prob job serves full weights; adapters need training_config.lora"
            )
        if not isinstance(name, str) or not name or "@" in name or name == BASE_ADAPTER:
            raise InvalidRequestError(
                f"adapter name {name!r} must be a non-empty name without '@', not "
                f"{BASE_ADAPTER!r} (reserved for the base model)"
            )
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidRequestError(f"adapter version {version!r} must be an int >= 0")
        checked = ds_lora.checked_adapter(self._model.module, weights)  # parameter names
        tensors = {param: t.detach().cpu().clone() for param, t in checked}
        versions = self._served.setdefault(name, {})
        versions[version] = tensors
        for old in sorted(versions)[:-MAX_VERSIONS]:
            del versions[old]
        if self._live == (name, version):
            self._live = None  # replaced under the same version: copy it in again
        return {
            "strategy": "adapter",
            "adapter": name,
            "weight_version": version,
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "requests_in_flight": 0,
            "load_seconds": time.monotonic() - start,
        }

    def adapters(self) -> dict[str, list[int]]:
        """The loaded adapters and their versions."""
        return {name: sorted(v) for name, v in sorted(self._served.items()) if v}

    def remove_adapter(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Drop one version of ``name``, or all of them."""
        versions = self._served.get(name) or {}
        gone = sorted(versions) if version is None else [version]
        if not versions or any(v not in versions for v in gone):
            what = f"adapter {name!r}" + ("" if version is None else f" version {version}")
            raise AdapterNotFoundError(f"{what} is not loaded; loaded: {self.adapters()}")
        for v in gone:
            del versions[v]
            if self._live == (name, v):
                self._live = None
        if not versions:
            del self._served[name]
        return {"adapter": name, "removed": gone, "adapters": self.adapters()}

    def _next_default_version(self) -> int:
        return max(self._served.get(DEFAULT_ADAPTER) or [0]) + 1

    @contextlib.contextmanager
    def _serving(self, adapter: str | None, version: int | None) -> Iterator[None]:
        """Run the block with ``adapter`` at ``version`` in the model (see the module doc)."""
        if self._lora is None:
            if adapter is not None or version is not None:
                raise InvalidRequestError(
                    f"adapter={adapter!r}: this log-prob job serves full weights, not adapters"
                )
            yield
            return
        chosen = self._resolve(adapter, version)
        if chosen is None:
            with self._model.module.disable_adapter():
                yield
            return
        if self._live != chosen:
            name, v = chosen
            self._live = None
            ds_model.load_weights(self._model.module, self._served[name][v].items())
            self._live = chosen
        yield

    def _resolve(self, adapter: str | None, version: int | None) -> tuple[str, int] | None:
        """``(name, version)`` to serve, or None for the base."""
        if adapter == BASE_ADAPTER:
            if version is not None:
                raise InvalidRequestError(f"adapter {BASE_ADAPTER!r} has no versions")
            return None
        name = DEFAULT_ADAPTER if adapter is None else adapter
        versions = self._served.get(name) or {}
        if not versions:
            if adapter is None and version is None:
                return None  # nothing synced yet: the base
            raise AdapterNotFoundError(
                f"adapter {name!r} is not loaded; loaded: {self.adapters()} (or "
                f"{BASE_ADAPTER!r} for the base model)"
            )
        if version is None:
            return name, max(versions)
        if version not in versions:
            raise AdapterNotFoundError(
                f"adapter {name!r} has no version {version}; loaded: {sorted(versions)}"
            )
        return name, version
