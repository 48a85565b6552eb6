"""Registers the ``tinker`` transport and Tinker's losses (``tinker.cross_entropy``, ...)."""

from arctic_platform.rl.api import TransportSpec, hookimpl


@hookimpl
def arctic_rl_register_transports():  # type: ignore[no-untyped-def]
    """The Tinker SDK's REST API on host:port (server side only; clients use the SDK)."""
    yield TransportSpec(
        name="tinker",
        factory="arctic_rl_tinker.serve:no_client",
        server_factory="arctic_rl_tinker.serve:serve",
        network_address=True,
        default_port=8000,
        description="the tinker==0.38.0 SDK's REST API (X-API-Key auth, protobuf results)",
    )


@hookimpl
def arctic_rl_register_losses():  # type: ignore[no-untyped-def]
    """Tinker's cross_entropy, importance_sampling, ppo, cispo and dro (sums over tokens)."""
    from arctic_rl_tinker.losses import loss_specs

    yield from loss_specs()
