"""Hook implementations: the trackers this package adds (``report_to`` names)."""

from arctic_platform.rl.api import TrackerSpec, hookimpl


@hookimpl
def arctic_rl_register_trackers():
    """tensorboard, mlflow and wandb; each library is imported only when its tracker is built."""
    yield TrackerSpec(
        name="tensorboard",
        factory="arctic_rl_trackers.tensorboard_tracker:TensorBoardTracker",
        description="TensorBoard event files in LOG_DIR/tensorboard",
    )
    yield TrackerSpec(
        name="mlflow",
        factory="arctic_rl_trackers.mlflow_tracker:MlflowTracker",
        description="an MLflow run ($MLFLOW_TRACKING_URI, else a file store in LOG_DIR/mlruns)",
    )
    yield TrackerSpec(
        name="wandb",
        factory="arctic_rl_trackers.wandb_tracker:WandbTracker",
        description="a Weights & Biases run in LOG_DIR/wandb (offline without an API key)",
    )
