"""The hook specifications that Arctic RL plugins implement.

A plugin is a module (or object) registered under the ``arctic_rl`` entry-point group.
It implements any of the hooks below, each returning typed spec objects. A complete
third-party plugin, installed with an entry point alone::

    # my_backend/plugin.py
    from arctic_platform.rl.api import BackendSpec, LossSpec, hookimpl

    @hookimpl
    def arctic_rl_register_backends():
        yield BackendSpec(name="my-cluster", factory="my_backend.backend:MyBackend",
                          description="jobs on my cluster")

    @hookimpl
    def arctic_rl_register_losses():
        yield LossSpec(name="my-loss", factory="my_backend.loss:make_loss")

    # pyproject.toml
    [project.entry-points.arctic_rl]
    my_backend = "my_backend.plugin"

Factories given as ``"pkg.module:attr"`` strings are imported only when used, so
registering a plugin never imports torch, vllm, deepspeed or ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the hooks' return types, for readers and type checkers only
    from arctic_platform.rl.plugins import specs

PROJECT_NAME = "arctic_rl"
ENTRY_POINT_GROUP = "arctic_rl"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class ArcticRLHookSpecs:
    """Every hook an Arctic RL plugin may implement."""

    @hookspec
    def arctic_rl_register_backends(self) -> Iterable[specs.BackendSpec]:  # type: ignore[empty-body]
        """Backends (config field ``backend``): who owns the cluster the jobs run on.

        Example::

            @hookimpl
            def arctic_rl_register_backends():
                yield BackendSpec(name="mine", factory="my_plugin.backend:MyBackend")
        """

    @hookspec
    def arctic_rl_register_transports(self) -> Iterable[specs.TransportSpec]:  # type: ignore[empty-body]
        """Transports (config field ``comm_protocol``): how the client reaches the server.

        Example::

            @hookimpl
            def arctic_rl_register_transports():
                yield TransportSpec(name="http", factory="pkg.client:HttpClient",
                                    server_factory="pkg.server:serve", default_port=7000)
        """

    @hookspec
    def arctic_rl_register_engines(self) -> Iterable[specs.EngineSpec]:  # type: ignore[empty-body]
        """Engines for the roles ``training``, ``sampling`` and ``log_prob``.

        Example::

            @hookimpl
            def arctic_rl_register_engines():
                yield EngineSpec(name="vllm", role="sampling", factory="pkg.vllm:Sampler")
        """

    @hookspec
    def arctic_rl_register_losses(self) -> Iterable[specs.LossSpec]:  # type: ignore[empty-body]
        """Loss functions for ``fwd_bwd(loss_fn=...)``.

        Example::

            @hookimpl
            def arctic_rl_register_losses():
                yield LossSpec(name="grpo", factory="pkg.losses:GRPOLoss")
        """

    @hookspec
    def arctic_rl_register_commands(self) -> Iterable[specs.CommandSpec]:  # type: ignore[empty-body]
        """Subcommands of ``arctic-rl`` (``arctic-rl NAME ...``), beside the built-in ones.

        A command named like a built-in one (``serve``, ``plugins``, ...) is ignored with a
        warning; two plugins with one name make the command report both.

        Example::

            @hookimpl
            def arctic_rl_register_commands():
                yield CommandSpec(name="hello", summary="say hello",
                                  configure_parser="pkg.cli:add_arguments",
                                  action="pkg.cli:run")
        """

    @hookspec
    def arctic_rl_register_trackers(self) -> Iterable[specs.TrackerSpec]:  # type: ignore[empty-body]
        """Experiment trackers that ``RunTracker(report_to=[...])`` writes a loop's metrics to.

        Example::

            @hookimpl
            def arctic_rl_register_trackers():
                yield TrackerSpec(name="trackio", factory="pkg.tracker:TrackioTracker")
        """


HOOK_KINDS: dict[str, str] = {
    "arctic_rl_register_backends": "backend",
    "arctic_rl_register_transports": "transport",
    "arctic_rl_register_engines": "engine",
    "arctic_rl_register_losses": "loss",
    "arctic_rl_register_commands": "command",
    "arctic_rl_register_trackers": "tracker",
}
