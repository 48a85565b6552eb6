"""Registers the built-in engines."""

from arctic_platform.rl.api import EngineSpec, hookimpl
from arctic_rl_engines.ds_model import HF_EXPORT_DIR

SAMPLING_CONCURRENCY = 256
"""Calls a vLLM sampling worker accepts at once; its request loop batches them."""


@hookimpl
def arctic_rl_register_engines():  # type: ignore[no-untyped-def]
    """deepspeed: training and log_prob; vllm: sampling and log_prob."""
    yield EngineSpec(
        name="deepspeed",
        role="training",
        factory="arctic_rl_engines.deepspeed_training:DeepSpeedTrainingEngine",
        hf_export_dir=HF_EXPORT_DIR,
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
        max_concurrency=SAMPLING_CONCURRENCY,
        description="vLLM generation with in-place weight updates",
    )
    yield EngineSpec(
        name="vllm",
        role="log_prob",
        factory="arctic_rl_engines.vllm_log_prob:VLLMLogProbEngine",
        description="vLLM prompt log-probs of prompt + completion",
    )
