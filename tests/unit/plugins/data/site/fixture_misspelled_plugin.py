"""A plugin with a misspelled hook name: check_pending must catch it."""

from arctic_platform.rl.plugins import BackendSpec, hookimpl


@hookimpl
def arctic_rl_register_backend():
    yield BackendSpec(name="fixture-misspelled", factory="x:y")
