from arctic_platform.rl.plugins import BackendSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():
    yield BackendSpec(name="fixture-dup", factory="fixture_dup_a_plugin:make")


def make():
    return "a"
