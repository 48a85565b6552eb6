"""Registers the ``http`` transport."""

from arctic_platform.rl.plugins import TransportSpec, hookimpl, not_implemented_yet


@hookimpl
def arctic_rl_register_transports():  # type: ignore[no-untyped-def]
    """HTTP on host:port (default port 7000)."""
    yield TransportSpec(
        name="http",
        factory=not_implemented_yet("the 'http' transport client"),
        server_factory=not_implemented_yet("the 'http' transport server"),
        network_address=True,
        default_port=7000,
        description="JSON control + safetensors frames over HTTP (FastAPI, httpx)",
    )
