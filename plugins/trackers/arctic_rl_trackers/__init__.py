"""Experiment trackers for ``RunTracker``: tensorboard, mlflow and wandb, one module each."""
