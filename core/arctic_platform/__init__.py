"""Arctic Platform: the namespace that holds Arctic RL (``arctic_platform.rl``)."""
