"""Registers the built-in engines."""

from arctic_platform.rl.api import EngineSpec, hookimpl


@hookimpl
def arctic_rl_register_engines():  # type: ignore[no-untyped-def]
    """deepspeed: training and log_prob; vllm: sampling and log_prob."""
    yield EngineSpec(
        name="deepspeed",
        role="training",
        factory="arctic_rl_engines.deepspeed_training:DeepSpeedTrainingEngine",
        description="DeepSpeed ZeRO 0-3 training (forward/backward, step, checkpoints)",
    )
    yield EngineSpec(
        name="deepspeed",
        role="log_prob",
        factory="arctic_rl_engines.deepspeed_log_prob:DeepSpeedLogProbEngine",
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
