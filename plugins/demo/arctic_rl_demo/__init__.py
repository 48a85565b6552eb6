"""The Arctic RL demo: an application on the public client, the ``arctic-rl demo`` command.

SFT warm start then GRPO on a task with a tiny model on CPU: one loop (``runner``) and the
tasks it runs, one folder each under ``tasks`` (``reverse``: digit reversal, synchronous or
``--async`` one-step off-policy; ``lookup``: a tool-calling agent); ``plugin`` registers the
command.
"""
