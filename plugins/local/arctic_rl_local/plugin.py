"""Registers the ``local`` backend."""

from arctic_platform.rl.api import BackendSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():  # type: ignore[no-untyped-def]
    """The local backend: server subprocess and Ray cluster on this node."""
    yield BackendSpec(
        name="local",
        factory="arctic_rl_local.backend:LocalBackend",
        needs_gpus=True,  # it creates the jobs on a cluster it starts for them
        description="start or attach to an Arctic RL server and a Ray cluster on this node",
    )
