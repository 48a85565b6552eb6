"""Registers the ``dss-platform`` backend."""

from arctic_platform.rl.plugins import BackendSpec, hookimpl, not_implemented_yet


@hookimpl
def arctic_rl_register_backends():  # type: ignore[no-untyped-def]
    """The dss-platform backend: a remote platform speaking the DSS protocol."""
    yield BackendSpec(
        name="dss-platform",
        factory=not_implemented_yet("the 'dss-platform' backend"),
        description="jobs on a remote platform (DSS protocol); no local processes",
    )
