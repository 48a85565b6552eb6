"""Registers the ``ray`` transport."""

from arctic_platform.rl.api import TransportSpec, hookimpl


@hookimpl
def arctic_rl_register_transports():  # type: ignore[no-untyped-def]
    """Ray actor calls; no host or port."""
    yield TransportSpec(
        name="ray",
        factory="arctic_rl_ray.client:RayTransport",
        server_factory="arctic_rl_ray.server:serve",
        network_address=False,
        default_port=None,
        description="RLServer as a named detached Ray actor; tensors via the object store",
    )
