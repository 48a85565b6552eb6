from arctic_platform.rl.plugins import BackendSpec, CommandSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():
    yield BackendSpec(name="fixture-dup", factory="fixture_dup_a_plugin:make")


def make():
    return "a"


@hookimpl
def arctic_rl_register_commands():
    yield CommandSpec(name="fixture-dup", summary="a", configure_parser=make, action=make)
