"""The contracts between core and plugins: backends, transports, engines and losses.

Engines are built by their spec's factory as ``factory(config, context)`` where ``config``
is the job's ``ArcticRLClientConfig`` and ``context`` an ``EngineContext``; the caller sets
the distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) first.
Tensors cross these interfaces as torch tensors; training batches as one ``Batch``
(``arctic_platform.rl.batch``), built and checked at the transport edge, shared by all ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import threading
    from collections.abc import Mapping
    from pathlib import Path

    import torch

    from arctic_platform.rl.batch import Batch, BatchLimits
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.losses import LossOutput


@dataclass
class EngineContext:
    """Where an engine instance sits: its rank in the job and its working directory."""

    role: str
    rank: int = 0
    world_size: int = 1
    replica: int = 0
    work_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ServedAdapter(TypedDict, total=False):
    """Which weights serve a generate or log_probs call in a LoRA run: ``adapter`` (``"base"``:
    the base model) at ``adapter_version``; unset or None: the defaults."""

    adapter: str | None
    adapter_version: int | None


class Engine(ABC):
    """What every engine offers: weights in and out, memory time-sharing, shutdown."""

    @abstractmethod
    def weight_norm(self) -> float:
        """L2 norm over all weights (float64 accumulation), to compare engines after a sync."""

    def batch_limits(self) -> BatchLimits | None:
        """The limits a batch must keep here (vocabulary, context); the server checks them
        once per request. None: none are checked."""
        return None

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """Release device memory; returns what was done (``{"supported": False}`` if nothing)."""
        return {"supported": False, "reason": "sleep is not supported by this engine"}

    def wake(self) -> dict[str, Any]:
        """Undo ``sleep``."""
        return {"supported": False, "reason": "wake is not supported by this engine"}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free every resource the engine holds."""


class TrainingEngine(Engine):
    """Forward/backward, optimizer step and checkpoints of the policy being trained."""

    @abstractmethod
    def fwd_bwd(
        self,
        batch: Batch,
        loss_fn: str = "grpo",
        loss_config: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """Accumulate gradients of ``loss_fn`` over ``batch``.

        Returns metrics as ``{name}.sum``/``{name}.tokens`` pairs plus their ratios. The server
        may also pass ``return_log_probs=True`` (answer ``log_probs`` per row) and
        ``forward_only=True`` (no gradient); an engine without them refuses such calls.
        ``batch`` is checked against ``batch_limits``; a caller in-process may pass a dict of
        fields, which ``Batch.build`` turns into one."""

    @abstractmethod
    def fwd_no_grad(self, batch: Batch, reference_model: bool = False) -> list[list[float]]:
        """Per-token log-probs of each row's ``input_ids`` (entry 0 is 0.0)."""

    @abstractmethod
    def step(self, learning_rate: float | None = None) -> dict[str, Any]:
        """Apply the optimizer; returns ``global_step``, ``lr``, ``grad_norm``, ``applied``.

        With nothing accumulated since the last step or load: change nothing, ``applied=False``.
        The server passes a second argument, ``optimizer_params`` (AdamW ``beta1``, ``beta2``,
        ``eps``, ``weight_decay``, ``grad_clip_norm``), when a client sets any of them.
        """

    @abstractmethod
    def save_checkpoint(self, directory: str, tag: str | None = None) -> str:
        """Write full training state under ``directory`` atomically; returns its path."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> int:
        """Restore the state written by ``save_checkpoint``; returns the global step."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) tensors in Hugging Face parameter names."""

    @property
    @abstractmethod
    def global_step(self) -> int:
        """Optimizer steps taken so far."""


class SamplingEngine(Engine):
    """Rollout generation with in-place weight updates."""

    @abstractmethod
    def generate(
        self, prompts: list[str] | list[list[int]], sampling_params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Per prompt: ``prompt_token_ids`` and ``completions`` (token_ids, text, logprobs,
        finish_reason)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the served weights in place, without restarting the engine."""

    @abstractmethod
    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (mandatory after a weight update)."""


class LogProbEngine(Engine):
    """Log-probs of given completions under the current (or reference) weights."""

    @abstractmethod
    def log_probs(
        self, prompts: list[list[int]], completions: list[list[int]], top_k: int = 1
    ) -> list[dict[str, Any]]:
        """Per pair: ``log_probs`` of each completion token, and ``top_k`` alternatives."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place."""


class Backend(ABC):
    """Who owns the cluster: starts or reaches the server, and stops what it started."""

    @abstractmethod
    def start(self, config: ArcticRLClientConfig) -> Any:
        """Make a server reachable for ``config``; returns the transport client connected to it."""

    @abstractmethod
    def stop(self) -> None:
        """Stop whatever this backend started (server process, Ray cluster)."""


class ClientTransport(ABC):
    """The client side of a transport: one call per server operation."""

    @abstractmethod
    def call(self, operation: str, payload: dict[str, Any] | None = None) -> Any:
        """Invoke ``operation`` on the server with ``payload``; returns its decoded result."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class OperationHandler(Protocol):
    """What a server transport serves: ``RLServer``, or anything with its two members."""

    shutdown_requested: threading.Event

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        """Run operation ``name`` (a row of ``operations.OPERATIONS``) on ``payload``."""
        ...


class ServerTransport(Protocol):
    """A ``TransportSpec.server_factory`` with ``network_address=True``.

    Serves ``server`` on ``host:port`` (requests carry ``token`` when it is set) in the
    calling thread, and returns once ``server.shutdown_requested`` is set.
    """

    def __call__(
        self, server: OperationHandler, host: str, port: int, token: str | None
    ) -> None: ...


class HostingServerTransport(Protocol):
    """A ``TransportSpec.server_factory`` with ``network_address=False``.

    Creates and hosts the ``RLServer`` itself (e.g. in a Ray actor) for ``run_dir`` with the
    server's keyword options (``num_gpus``, ``op_timeout``, ``resume``, ``settings`` with the
    serve command's host and port, and ``token`` for what it serves over HTTP, such as the
    agent session routes), until shutdown.
    """

    def __call__(self, run_dir: Path, **options: Any) -> None: ...


class LossFn(Protocol):
    """A loss for ``fwd_bwd``, called once per micro-batch (see ``arctic_platform.rl.losses``).

    ``log_probs`` is ``[B, T]`` with grad; ``batch`` holds ``[B, T]`` tensors and the global
    ``num_tokens``/``num_seqs``. Returns a ``LossOutput`` or a per-token ``[B, T]`` tensor.
    """

    def __call__(
        self, log_probs: torch.Tensor, batch: Mapping[str, Any], **config: Any
    ) -> LossOutput | torch.Tensor: ...
