"""Registers the ``http`` transport."""

from arctic_platform.rl.api import TransportSpec, hookimpl


@hookimpl
def arctic_rl_register_transports():  # type: ignore[no-untyped-def]
    """HTTP on host:port (default port 7000)."""
    yield TransportSpec(
        name="http",
        factory="arctic_rl_http.client:HttpTransport",
        server_factory="arctic_rl_http.serve:serve",
        network_address=True,
        default_port=7000,
        description="JSON control + safetensors frames over HTTP (FastAPI/uvicorn, httpx)",
    )
