"""The Arctic RL demo: an application on the public client, the ``arctic-rl demo`` command.

SFT warm start then GRPO (synchronous or ``--async`` one-step off-policy) on a digit-reversal
task with a tiny model on CPU. ``main.run_demo`` runs it; ``plugin`` registers the command.
"""
