"""Typed spec objects that plugin hooks return: one per backend, transport, engine, loss or
``arctic-rl`` command."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from arctic_platform.rl.errors import NotImplementedInThisVersion, PluginError

EngineRole = Literal["training", "sampling", "log_prob"]
ENGINE_ROLES: tuple[EngineRole, ...] = ("training", "sampling", "log_prob")
PluginKind = Literal["backend", "transport", "engine", "loss", "command", "tracker"]


def normalize_name(name: str) -> str:
    """The canonical form of a plugin name: stripped and lower-cased."""
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"a plugin name must be a non-empty string, got {name!r}")
    return name.strip().lower()


def resolve_factory(factory: Any, what: str) -> Any:
    """Import a lazy ``"pkg.mod:attr"`` factory string, or return a callable as it is."""
    if not isinstance(factory, str):
        return factory
    module_name, sep, attr = factory.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{what}: factory {factory!r} is not of the form 'pkg.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{what}: cannot import {module_name!r} ({exc})") from exc
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise PluginError(f"{what}: {module_name!r} has no attribute {attr!r}") from exc
    return obj


def not_implemented_yet(what: str) -> Any:
    """A factory for a registered component that a later version will build."""

    def factory(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedInThisVersion(f"{what} is not implemented yet in this version")

    factory.__doc__ = f"Placeholder: {what} is not implemented yet in this version."
    factory.not_implemented_yet = True  # type: ignore[attr-defined]
    return factory


@dataclass(frozen=True)
class _Spec:
    name: str
    factory: Any
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", normalize_name(self.name))

    @property
    def implemented(self) -> bool:
        """False for a placeholder whose factory says 'not implemented yet'."""
        if isinstance(self.factory, str):
            return True
        return not getattr(self.factory, "not_implemented_yet", False)

    def load(self) -> Any:
        """The factory itself, importing it first when it is a lazy string."""
        return resolve_factory(self.factory, f"{type(self).__name__} {self.name!r}")

    def create(self, *args: Any, **kwargs: Any) -> Any:
        """Build the component: ``load()(*args, **kwargs)``."""
        return self.load()(*args, **kwargs)


@dataclass(frozen=True)
class _ServedSpec(_Spec):
    """A spec whose optional ``server_factory`` runs its server side."""

    server_factory: Any = None
    no_server: ClassVar[str]  # "<kind> {name!r} has no ...": the error when it has none

    def load_server(self) -> Any:
        """The server-side factory, importing it when it is a lazy string."""
        if self.server_factory is None:
            raise PluginError(self.no_server.format(name=self.name))
        return resolve_factory(self.server_factory, f"{type(self).__name__} {self.name!r} server")


@dataclass(frozen=True)
class BackendSpec(_ServedSpec):
    """A backend: who owns the cluster (``local`` starts it, ``dss-platform`` is remote).

    ``server_factory``, when set, runs the platform server this backend talks to
    (``arctic-rl platform serve --backend NAME``); it is called with keyword arguments.
    ``needs_gpus``: a config for this backend that creates jobs must give at least one job
    GPUs (checked when the config is built; a reconnecting config creates nothing).
    ``transports``: the ``comm_protocol`` values this backend speaks (empty: any of them);
    a config naming another is refused when it is built.
    """

    needs_gpus: bool = False
    transports: tuple[str, ...] = ()
    no_server: ClassVar[str] = "backend {name!r} has no platform server"


@dataclass(frozen=True)
class TransportSpec(_ServedSpec):
    """A transport between client and server.

    ``factory`` builds the client side; ``server_factory`` hosts an ``RLServer``.
    ``network_address`` says whether the transport uses host/port; when True and the
    config leaves them unset, host becomes this node's primary IPv4 and port ``default_port``.
    """

    network_address: bool = True
    default_port: int | None = None
    no_server: ClassVar[str] = "transport {name!r} has no server side"


@dataclass(frozen=True)
class EngineSpec(_Spec):
    """An engine for one job role: ``training``, ``sampling`` or ``log_prob``.

    ``max_concurrency``: calls one worker of this engine accepts at once (an engine whose
    request loop batches concurrent calls asks for many). ``hf_export_dir`` (training
    engines): the subdirectory of a saved checkpoint that holds a Hugging Face export, which
    a restarted sampling or log-prob job loads; None when the engine writes none.
    """

    role: EngineRole = "training"
    max_concurrency: int = 4
    hf_export_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.role not in ENGINE_ROLES:
            raise PluginError(
                f"EngineSpec {self.name!r}: role {self.role!r} is not one of {list(ENGINE_ROLES)}"
            )
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise PluginError(
                f"EngineSpec {self.name!r}: max_concurrency must be a positive integer, got "
                f"{self.max_concurrency!r}"
            )


@dataclass(frozen=True)
class LossSpec(_Spec):
    """A loss function for ``fwd_bwd``; ``factory`` returns a ``LossFn``."""

    defaults: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrackerSpec(_Spec):
    """An experiment tracker (``RunTracker(report_to=[NAME])``): ``factory(settings)`` gets a
    ``TrackerSettings`` and returns an object with ``log(metrics, step)`` and ``close()``."""


_COMMAND_NAME = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class CommandSpec:
    """An ``arctic-rl`` subcommand that a plugin adds: ``arctic-rl NAME ...``.

    ``configure_parser(parser)`` adds the command's arguments to the ``argparse`` parser the
    CLI made for it (its help is ``summary``); ``action(args)`` runs the command with the parsed
    ``argparse.Namespace`` and returns the exit status. Either may be a lazy
    ``"pkg.module:attr"`` string: the parser's module is imported when the CLI builds its
    parser, the action's only when the command runs.
    """

    name: str
    summary: str
    configure_parser: Any
    action: Any

    implemented: ClassVar[bool] = True

    def __post_init__(self) -> None:
        name = normalize_name(self.name)
        if not _COMMAND_NAME.fullmatch(name):
            raise PluginError(
                f"CommandSpec {self.name!r}: a command name is a lower-case word "
                "(letters, digits and '-', starting with a letter)"
            )
        object.__setattr__(self, "name", name)

    @property
    def description(self) -> str:
        """The summary (what ``arctic-rl plugins list`` shows for every kind)."""
        return self.summary

    def load_configure_parser(self) -> Any:
        """The parser hook, importing it first when it is a lazy string."""
        return resolve_factory(self.configure_parser, f"CommandSpec {self.name!r} parser")

    def load_action(self) -> Any:
        """The action, importing it first when it is a lazy string."""
        return resolve_factory(self.action, f"CommandSpec {self.name!r} action")


SPEC_TYPES: dict[str, type] = {
    "backend": BackendSpec,
    "transport": TransportSpec,
    "engine": EngineSpec,
    "loss": LossSpec,
    "command": CommandSpec,
    "tracker": TrackerSpec,
}
"""The spec type each plugin kind's hook yields."""
