"""Hook implementations: what this package adds to Arctic RL."""

from arctic_platform.rl.api import BackendSpec, LossSpec, TrackerSpec, hookimpl


@hookimpl
def arctic_rl_register_backends():
    """The attach-only ``example`` backend."""
    yield BackendSpec(
        name="example",
        factory="arctic_rl_example.backend:AttachOnlyBackend",
        description="attach to a running Arctic RL server; never start one",
    )


@hookimpl
def arctic_rl_register_losses():
    """The ``example-loss`` loss."""
    yield LossSpec(name="example-loss", factory="arctic_rl_example.loss:make_loss")


@hookimpl
def arctic_rl_register_trackers():
    """The ``example-csv`` tracker."""
    yield TrackerSpec(
        name="example-csv",
        factory="arctic_rl_example.tracker:CsvTracker",
        description="every metric as a row of LOG_DIR/example-tracker.csv",
    )
