"""An example third-party Arctic RL plugin package."""
