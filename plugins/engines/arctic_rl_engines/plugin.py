"""Registers the built-in engines."""

from arctic_platform.rl.plugins import EngineSpec, hookimpl, not_implemented_yet


@hookimpl
def arctic_rl_register_engines():  # type: ignore[no-untyped-def]
    """deepspeed: training and log_prob; vllm: sampling and log_prob."""
    yield EngineSpec(
        name="deepspeed",
        role="training",
        factory=not_implemented_yet("the 'deepspeed' training engine"),
        description="DeepSpeed ZeRO 0-3 training (forward/backward, step, checkpoints)",
    )
    yield EngineSpec(
        name="deepspeed",
        role="log_prob",
        factory=not_implemented_yet("the 'deepspeed' log-prob engine"),
        description="DeepSpeed forward-only log-probs",
    )
    yield EngineSpec(
        name="vllm",
        role="sampling",
        factory="arctic_rl_engines.vllm_sampling:VLLMSamplingEngine",
        description="vLLM generation with in-place weight updates",
    )
    yield EngineSpec(
        name="vllm",
        role="log_prob",
        factory="arctic_rl_engines.vllm_log_prob:VLLMLogProbEngine",
        description="vLLM prompt log-probs of prompt + completion",
    )
