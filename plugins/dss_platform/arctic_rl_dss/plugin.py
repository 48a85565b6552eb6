"""Registers the ``dss-platform`` backend and its reference platform server."""

from collections.abc import Iterator

from arctic_platform.rl.api import BackendSpec, hookimpl


@hookimpl
def arctic_rl_register_backends() -> Iterator[BackendSpec]:
    """The dss-platform backend: a remote platform speaking the DSS protocol."""
    yield BackendSpec(
        name="dss-platform",
        factory="arctic_rl_dss.backend:DssPlatformBackend",
        description="jobs on a remote platform (DSS protocol); no local processes",
        server_factory="arctic_rl_dss.serve:serve_platform",
        transports=("http",),  # its own http client to the platform; no ray transport
    )
