"""LoRA adapters in the vLLM engines: engine arguments, PEFT directories, versions served.

In LoRA mode (``training_config.lora`` set) vLLM starts with ``enable_lora`` and every adapter
version is a PEFT directory ``<work dir>/adapters/<name>/v<version>/`` loaded under the vLLM
name ``<name>@v<version>`` with a fresh integer id. Versions are immutable: a new version is a
new name and directory, so requests in flight keep theirs and no prefix cache is shared. The
directory stays while the version is known, because vLLM reloads an adapter its LRU cache
(``max_cpu_loras``) evicted from there.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import DEFAULT_ADAPTER, EngineError, InvalidRequestError
from arctic_rl_engines.ds_adapter_bank import AdapterNotFoundError
from arctic_rl_engines.lora_format import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config_dict
from arctic_rl_engines.lora_names import (
    BASE_ADAPTER,
    bad_adapter_name,
    is_lora_a,
    is_lora_tensor,
    vllm_adapter_name,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from arctic_platform.rl.api import ArcticRLClientConfig, LoraConfig

MAX_LORAS = 4  # adapters one batch may mix (vLLM's LoRA slots)
MAX_CPU_LORAS = 16  # adapter versions vLLM keeps loaded (LRU); evicted ones reload from disk


def lora_of(config: ArcticRLClientConfig) -> LoraConfig | None:
    """The job's LoRA settings (``training_config.lora``), or None in full-weight mode."""
    training = config.training_config
    return None if training is None else training.lora


def lora_engine_kwargs(lora: LoraConfig | None) -> dict[str, Any]:
    """vLLM's LoRA arguments for a LoRA job (empty in full mode); ``vllm_config`` may override."""
    if lora is None:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": lora.served_rank,
        "max_loras": MAX_LORAS,
        "max_cpu_loras": MAX_CPU_LORAS,
    }


def named_tensor(item: object, what: str) -> tuple[str, torch.Tensor]:
    """``item`` as a ``(name, tensor)`` pair; else InvalidRequestError naming ``what`` got it."""
    import torch

    try:
        name, tensor = item  # type: ignore[misc]
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"{what} expects (name, tensor) pairs, got {type(item).__name__}"
        ) from None
    if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
        raise InvalidRequestError(
            f"{what} expects (str, torch.Tensor) pairs, got "
            f"({type(name).__name__}, {type(tensor).__name__}) for {name!r}"
        )
    return name, tensor


def adapter_tensors(
    weights: Iterable[tuple[str, torch.Tensor]], max_rank: int
) -> tuple[dict[str, torch.Tensor], int]:
    """Check adapter tensors (peft export names); returns them (CPU, contiguous) and their rank.

    Every name must be a ``lora_A``/``lora_B`` weight, all of one rank ``r`` (``lora_A``
    ``[r, in]``, ``lora_B`` ``[out, r]``) with ``r <= max_rank``; else InvalidRequestError.
    """

    tensors: dict[str, torch.Tensor] = {}
    for item in weights:
        name, tensor = named_tensor(item, "load_adapter")
        if not is_lora_tensor(name):
            raise InvalidRequestError(
                f"{name!r} is not a LoRA adapter tensor (...lora_A.weight or ...lora_B.weight): "
                "a full-weight sync into a LoRA job is refused (its base model is frozen; "
                "sync the trainer's adapter); nothing was loaded"
            )
        if name in tensors:
            raise InvalidRequestError(f"adapter weights hold {name!r} twice")
        if tensor.dim() != 2:
            raise InvalidRequestError(
                f"adapter tensor {name!r} must be 2-D, got shape {list(tensor.shape)}"
            )
        tensors[name] = tensor.detach().to("cpu").contiguous()
    if not tensors:
        raise InvalidRequestError("load_adapter got no tensors")
    ranks = {int(t.shape[0] if is_lora_a(n) else t.shape[1]) for n, t in tensors.items()}
    if len(ranks) != 1:
        raise InvalidRequestError(
            f"adapter tensors have mixed ranks {sorted(ranks)}; one adapter has one rank"
        )
    rank = ranks.pop()
    if rank > max_rank:
        raise InvalidRequestError(
            f"the adapter's rank is {rank}, above this job's max_lora_rank {max_rank} "
            "(training_config.lora.rank, or vllm_config max_lora_rank)"
        )
    return tensors, rank


def check_version(version: object) -> int:
    """``version`` as an adapter version (an integer >= 0); else InvalidRequestError."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidRequestError(f"adapter version must be an integer >= 0, got {version!r}")
    return version


@dataclass(frozen=True)
class AdapterVersion:
    """One loaded adapter version: its vLLM request, directory and size."""

    name: str
    version: int
    request: Any  # vllm.lora.request.LoRARequest
    path: Path
    bytes: int
    sumsq: float  # sum of squares of its tensors (float64), for weight_norm


class AdapterStore:
    """The adapter versions one vLLM engine serves, and their PEFT directories (thread-safe).

    ``prepare`` checks the tensors and writes the directory (any thread); ``commit`` records
    a version once vLLM has it. ``root`` None: a temporary directory removed by ``close``.
    """

    def __init__(self, lora: LoraConfig, max_rank: int, root: str | Path | None = None) -> None:
        self.lora = lora
        self.max_rank = max_rank
        self._owned = root is None
        base = Path(tempfile.mkdtemp(prefix="arctic-rl-adapters-")) if root is None else root
        self.root = Path(base) / "adapters"
        self._versions: dict[str, dict[int, AdapterVersion]] = {}
        self._pending: set[tuple[str, int]] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def prepare(
        self, name: str, version: int, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> AdapterVersion:
        """Check name, version and tensors, then write the PEFT directory (nothing served yet)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        problem = bad_adapter_name(name)
        if problem:
            raise InvalidRequestError(problem)
        version = check_version(version)
        with self._lock:
            if version in self._versions.get(name, {}) or (name, version) in self._pending:
                raise InvalidRequestError(
                    f"adapter {name!r} version {version} is already loaded; versions are "
                    "immutable: load a new version (or remove this one first)"
                )
            self._pending.add((name, version))
        try:
            tensors, rank = adapter_tensors(weights, self.max_rank)
            try:
                config = adapter_config_dict(self.lora, rank)
            except ValueError as exc:
                raise InvalidRequestError(
                    f"adapter {name!r}: {exc} (training_config.lora.rank {self.lora.rank})"
                ) from exc
            path = self.root / name / f"v{version}"
            staging = path.with_name(f".v{version}.partial")
            for stale in (staging, path):
                shutil.rmtree(stale, ignore_errors=True)
            staging.mkdir(parents=True)
            import json

            (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
            save_file(tensors, str(staging / ADAPTER_WEIGHTS))
            staging.rename(path)
            size = sum(int(t.numel() * t.element_size()) for t in tensors.values())
            sumsq = sum(float(t.double().square().sum()) for t in tensors.values())
            request = LoRARequest(vllm_adapter_name(name, version), next(self._ids), str(path))
            return AdapterVersion(name, version, request, path, size, sumsq)
        except BaseException:
            with self._lock:
                self._pending.discard((name, version))
            raise

    def commit(self, entry: AdapterVersion) -> None:
        """Record ``entry`` as served (after vLLM accepted it)."""
        with self._lock:
            self._pending.discard((entry.name, entry.version))
            self._versions.setdefault(entry.name, {})[entry.version] = entry

    def discard(self, entry: AdapterVersion) -> None:
        """Forget a prepared version vLLM refused, and delete its directory."""
        with self._lock:
            self._pending.discard((entry.name, entry.version))
        shutil.rmtree(entry.path, ignore_errors=True)

    def resolve_entry(self, name: str, version: int) -> AdapterVersion | None:
        """The served entry of ``name`` at ``version``, or None."""
        with self._lock:
            return self._versions.get(name, {}).get(version)

    def latest(self, name: str) -> int | None:
        """The newest loaded version of ``name`` (None when it has none)."""
        with self._lock:
            versions = self._versions.get(name)
            return max(versions) if versions else None

    def resolve(self, adapter: str | None, version: int | None) -> AdapterVersion | None:
        """The version a request is served with: None = the base model.

        ``adapter`` None: the default adapter's latest version, or the base before any;
        ``"base"``: the base. An unknown name or version is an ``AdapterNotFoundError``.
        """
        if version is not None:
            check_version(version)
        if adapter == BASE_ADAPTER:
            if version is not None:
                raise InvalidRequestError(
                    f"adapter {BASE_ADAPTER!r} (the base model) has no versions; "
                    f"got adapter_version={version}"
                )
            return None
        with self._lock:
            name = DEFAULT_ADAPTER if adapter is None else adapter
            versions = self._versions.get(name)
            if not versions:
                if adapter is None and version is None:
                    return None
                raise AdapterNotFoundError(
                    f"adapter {name!r} is not loaded in this job; loaded: {self._listing()} "
                    f"(or {BASE_ADAPTER!r} for the base model)"
                )
            if version is None:
                return versions[max(versions)]
            if version not in versions:
                raise AdapterNotFoundError(
                    f"adapter {name!r} has no version {version} here; loaded: {self._listing()}"
                )
            return versions[version]

    def remove(self, name: str, version: int | None = None) -> list[AdapterVersion]:
        """Forget ``name`` (one version, or all): returns what was removed; directories stay
        until ``delete``."""
        if version is not None:
            check_version(version)
        with self._lock:
            versions = self._versions.get(name)
            if not versions or (version is not None and version not in versions):
                what = f"adapter {name!r}" + ("" if version is None else f" version {version}")
                raise AdapterNotFoundError(f"{what} is not loaded; loaded: {self._listing()}")
            chosen = sorted(versions) if version is None else [version]
            removed = [versions.pop(v) for v in chosen]
            if not versions:
                del self._versions[name]
            return removed

    @staticmethod
    def delete(entries: Iterable[AdapterVersion]) -> None:
        """Delete the directories of removed versions."""
        for entry in entries:
            shutil.rmtree(entry.path, ignore_errors=True)
            if entry.path.parent.exists() and not any(entry.path.parent.iterdir()):
                entry.path.parent.rmdir()

    def listing(self) -> dict[str, list[int]]:
        """``{name: [versions, oldest first]}`` of every loaded adapter."""
        with self._lock:
            return self._listing()

    def _listing(self) -> dict[str, list[int]]:
        return {name: sorted(v) for name, v in sorted(self._versions.items())}

    def close(self) -> None:
        """Delete the temporary directory (a work dir's adapters are left to the job)."""
        if self._owned:
            shutil.rmtree(self.root.parent, ignore_errors=True)


class LoraServing:
    """The adapter methods of a vLLM engine (mixed into ``VLLMEngine``).

    The engine sets ``self.lora`` and calls ``_lora_start`` once vLLM runs; ``_in_loop`` runs a
    function where vLLM may be touched (the sampling engine: its loop thread, between steps).
    """

    lora: LoraConfig | None = None
    adapter_store: AdapterStore | None = None
    llm: Any
    engine_kwargs: dict[str, Any]

    def _lora_start(self, work_dir: str | None) -> None:
        if self.lora is not None:
            max_rank = int(self.engine_kwargs.get("max_lora_rank") or self.lora.served_rank)
            self.adapter_store = AdapterStore(self.lora, max_rank, work_dir)
            # fixes of vLLM's LoRA: per-request adapters in prompt log-probs, base rows on CPU
            self.llm.collective_rpc("arctic_lora_fixes")

    def _in_loop(self, function: Callable[[], Any], when: str = "now") -> Any:
        return function()

    def _store(self, what: str) -> AdapterStore:
        if self.adapter_store is None:
            raise InvalidRequestError(
                f"{what} needs a LoRA job (training_config.lora set); this job serves full weights"
            )
        return self.adapter_store

    def load_adapter(
        self, name: str, version: int, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> dict[str, Any]:
        """Serve ``weights`` (peft export names) as ``name`` at ``version``, between two steps.

        Requests in flight keep the version they started with (no drain). Returns
        ``{strategy: "adapter", adapter, weight_version, bytes, requests_in_flight,
        load_seconds}``.
        """
        store = self._store("load_adapter")
        started = time.monotonic()
        entry = store.prepare(name, version, weights)

        def add() -> dict[str, Any]:
            in_flight = self._requests_in_flight()
            try:
                accepted = self.llm.llm_engine.add_lora(entry.request)
            except Exception as exc:
                store.discard(entry)
                raise InvalidRequestError(
                    f"vLLM refused adapter {name!r} version {version}: {exc}"
                ) from exc
            if accepted is False:
                store.discard(entry)
                raise EngineError(f"vLLM did not load adapter {name!r} version {version}")
            store.commit(entry)
            return {"requests_in_flight": in_flight}

        try:
            report = self._in_loop(add)
        except BaseException:
            if store.resolve_entry(name, version) is not entry:  # never reached vLLM
                store.discard(entry)
            raise
        return {
            "strategy": "adapter",
            "adapter": name,
            "weight_version": entry.version,
            "bytes": entry.bytes,
            "requests_in_flight": report["requests_in_flight"],
            "load_seconds": time.monotonic() - started,
        }

    def remove_adapter(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Stop serving ``name`` (one version, or all of them) once no request uses it."""
        store = self._store("remove_adapter")

        def remove() -> list[AdapterVersion]:
            removed = store.remove(name, version)
            for entry in removed:
                self.llm.llm_engine.remove_lora(entry.request.lora_int_id)
            store.delete(removed)
            return removed

        removed = self._in_loop(remove, "idle")
        return {"adapter": name, "removed_versions": [e.version for e in removed]}

    def adapters(self) -> dict[str, list[int]]:
        """``{name: [versions]}`` of the adapters this job serves (empty in full mode)."""
        return {} if self.adapter_store is None else self.adapter_store.listing()

    def _lora_request(
        self, adapter: str | None, adapter_version: int | None
    ) -> tuple[Any, int | None]:
        """(vLLM LoRA request or None for the base, adapter version or None) for one call."""
        if self.adapter_store is None:
            if adapter is None and adapter_version is None:
                return None, None
            if adapter == BASE_ADAPTER and adapter_version is None:
                return None, None
            raise InvalidRequestError(
                f"adapter={adapter!r}, adapter_version={adapter_version!r} needs a LoRA job "
                "(training_config.lora set); this job serves full weights"
            )
        entry = self.adapter_store.resolve(adapter, adapter_version)
        return (None, None) if entry is None else (entry.request, entry.version)

    def _refuse_adapter_tensors(self, names: Iterable[str]) -> None:
        """Full mode: adapter tensors are refused (they need a LoRA job)."""
        lora = [n for n in names if is_lora_tensor(n)]
        if lora:
            raise InvalidRequestError(
                f"{len(lora)} LoRA adapter tensor(s) (e.g. {lora[0]!r}) sent to a full-weight "
                "job: start the job with training_config.lora to serve adapters; nothing loaded"
            )

    def _requests_in_flight(self) -> int:
        return 0

    def _lora_close(self) -> None:
        if self.adapter_store is not None:
            self.adapter_store.close()
