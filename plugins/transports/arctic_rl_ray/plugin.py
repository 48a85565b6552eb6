"""Registers the ``ray`` transport."""

from arctic_platform.rl.plugins import TransportSpec, hookimpl, not_implemented_yet


@hookimpl
def arctic_rl_register_transports():  # type: ignore[no-untyped-def]
    """Ray actor calls; no host or port."""
    yield TransportSpec(
        name="ray",
        factory=not_implemented_yet("the 'ray' transport client"),
        server_factory=not_implemented_yet("the 'ray' transport server"),
        network_address=False,
        default_port=None,
        description="RLServer as a named detached Ray actor; tensors via the object store",
    )
