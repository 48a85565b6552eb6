from arctic_platform.rl.plugins import BackendSpec, CommandSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():
    yield BackendSpec(name="fixture-dup", factory="fixture_dup_b_plugin:make")


def make():
    return "b"


@hookimpl
def arctic_rl_register_commands():
    yield CommandSpec(name="fixture-dup", summary="b", configure_parser=make, action=make)
