"""A well-formed third-party plugin found through its checked-in .dist-info."""

from arctic_platform.rl.plugins import BackendSpec, LossSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():
    yield BackendSpec(name="Fixture-Good", factory="fixture_good_plugin:make_backend",
                      description="a backend from a fixture distribution")


@hookimpl
def arctic_rl_register_losses():
    yield LossSpec(name="fixture-loss", factory="fixture_good_plugin:make_loss")


def make_backend():
    return "fixture backend instance"


def make_loss():
    return "fixture loss instance"


@hookimpl
def arctic_rl_register_transports():
    from arctic_platform.rl.plugins import TransportSpec

    yield TransportSpec(name="fixture-pipe", factory="fixture_good_plugin:make_backend",
                        network_address=True, default_port=7999)


@hookimpl
def arctic_rl_register_engines():
    from arctic_platform.rl.plugins import EngineSpec

    yield EngineSpec(name="fixture-engine", role="log_prob", factory="fixture_good_plugin:make_loss")


@hookimpl
def arctic_rl_register_commands():
    from arctic_platform.rl.plugins import CommandSpec

    yield CommandSpec(name="fixture-hello", summary="say hello from a fixture",
                      configure_parser="fixture_good_plugin:hello_arguments",
                      action="fixture_good_plugin:hello")


def hello_arguments(parser):
    parser.add_argument("--who", default="world")


def hello(args):
    print(f"hello {args.who}")
    return 3
