"""LoRA adapters in the vLLM engines on CPU: log-probs vs transformers+peft (lm_head included),
immutable versions, no drain while an adapter loads, refusals. One engine of each kind serves
the whole module, in LoRA mode (``training_config.lora``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_reference import max_diff, random_peft_model, reference_log_probs

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
peft = pytest.importorskip("peft")

from arctic_platform.rl.errors import InvalidRequestError, NotFoundError  # noqa: E402

pytestmark = pytest.mark.slow

RANK = 8
ALPHA = 32.0
TOLERANCE = 1e-4  # float32 vLLM+LoRA vs float32 transformers+peft, nats
PROMPTS = [[30, 31, 32, 33, 34], [40, 12, 200, 7], [5, 6, 7, 8, 9, 10, 11]]
COMPLETIONS = [[50, 51, 52, 53], [100, 101], [300, 301, 302, 303, 304, 305]]


@pytest.fixture(scope="module")
def lora_config(vllm_test_config: Any) -> Any:
    """``(model_path, **vllm_config)`` -> a LoRA job's config (rank 8, alpha 32)."""
    from arctic_platform.rl.config import LoraConfig, TrainingConfig

    training = TrainingConfig(lora=LoraConfig(rank=RANK, alpha=ALPHA))

    def build(model_path: str, **vllm_config: Any) -> Any:
        config = vllm_test_config(model_path, **vllm_config)
        return config.model_copy(update={"training_config": training})

    return build


def peft_adapter(model_path: str, seed: int) -> tuple[Any, dict[str, Any]]:
    """A peft model on the tiny base with random lora_B (default targets, lm_head included),
    and its export: the tensors a LoRA trainer syncs."""
    from arctic_platform.rl.api import LoraConfig as ArcticLora

    targets = ArcticLora(rank=RANK).target_modules
    model = random_peft_model(model_path, RANK, ALPHA, targets, seed)
    exported = peft.get_peft_model_state_dict(model, save_embedding_layers=False)
    return model.eval(), {k: v.detach().clone() for k, v in exported.items()}


def scores(model: Any) -> list[list[float]]:
    return [reference_log_probs(model, p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]


def worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max(max_diff(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def adapters(tiny_model_path: str) -> dict[int, tuple[Any, dict[str, Any]]]:
    """Three peft adapters (seeds 1..3) on the tiny base."""
    return {seed: peft_adapter(tiny_model_path, seed) for seed in (1, 2, 3)}


@pytest.fixture(scope="module")
def sampler(
    tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory, lora_config: Any
) -> Iterator[Any]:
    """A LoRA sampling engine whose vLLM keeps 2 adapter versions (so versions get evicted)."""
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_rl_engines.vllm_sampling import VLLMSamplingEngine

    work_dir = tmp_path_factory.mktemp("sampling-job")
    config = lora_config(tiny_model_path, max_loras=2, max_cpu_loras=2)
    engine = VLLMSamplingEngine(config, EngineContext(role="sampling", work_dir=str(work_dir)))
    print(f"LoRA sampling engine started in {engine.start_seconds:.1f} s")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def scorer(tiny_model_path: str, lora_config: Any) -> Iterator[Any]:
    """The LoRA log-prob engine, built through the registry (adapters in a temp dir)."""
    from engine_build import registry_engine

    engine = registry_engine("vllm", "log_prob", lora_config(tiny_model_path))
    yield engine
    root = engine.adapter_store.root
    engine.close()
    assert not root.exists()  # its temporary adapter directory went with it


def engine_scores(engine: Any, **adapter: Any) -> list[list[float]]:
    if hasattr(engine, "log_probs"):
        return [r["log_probs"] for r in engine.log_probs(PROMPTS, COMPLETIONS, 0, **adapter)]
    params = {"max_tokens": 1, "prompt_logprobs": True, "temperature": 0.0}
    results = engine.generate(
        [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)], params, **adapter
    )
    return [r["prompt_logprobs"][len(p) :] for r, p in zip(results, PROMPTS, strict=True)]


def test_vllm_starts_with_lora_arguments_from_the_config(sampler, scorer):
    assert sampler.engine_kwargs["enable_lora"] is True
    assert sampler.engine_kwargs["max_lora_rank"] == RANK
    assert (sampler.engine_kwargs["max_loras"], sampler.engine_kwargs["max_cpu_loras"]) == (2, 2)
    assert (scorer.engine_kwargs["max_loras"], scorer.engine_kwargs["max_cpu_loras"]) == (4, 16)


def test_adapter_log_probs_match_peft_including_lm_head(scorer, adapters, tiny_model_path):
    model, exported = adapters[1]
    assert any(".lm_head.lora_" in name for name in exported)
    report = scorer.load_adapter("a", 1, exported.items())
    expected = scores(model)
    with model.disable_adapter():
        base = scores(model)

    served = engine_scores(scorer, adapter="a")
    served_base = engine_scores(scorer, adapter="base")
    diff, base_diff, moved = (
        worst(served, expected),
        worst(served_base, base),
        worst(expected, base),
    )
    print(
        f"log-prob engine: adapter vs peft {diff:.2e}, base vs transformers {base_diff:.2e}, "
        f"adapter vs base {moved:.3f}; load {report['load_seconds']:.3f} s, "
        f"{report['bytes']} bytes, {len(exported)} tensors"
    )
    assert report["strategy"] == "adapter" and report["weight_version"] == 1
    assert report["bytes"] == sum(t.numel() * 4 for t in exported.values())
    assert diff < TOLERANCE and base_diff < TOLERANCE
    assert worst(served, served_base) > 1e-3


def test_adapter_on_lm_head_alone_matches_peft(scorer, adapters):
    import copy

    model = adapters[2][0]
    head_only = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in head_only.named_parameters():
            if "lora_B" in name and "lm_head" not in name:
                param.zero_()
    tensors = peft.get_peft_model_state_dict(head_only, save_embedding_layers=False)
    scorer.load_adapter("head", 1, tensors.items())
    expected = scores(head_only)
    with head_only.disable_adapter():
        base = scores(head_only)
    served = engine_scores(scorer, adapter="head")
    diff, moved = worst(served, expected), worst(expected, base)
    print(f"lm_head-only adapter vs peft {diff:.2e} (moves log-probs by {moved:.3f})")
    assert moved > 1e-3
    assert diff < TOLERANCE


def test_sampler_serves_the_default_adapter_and_reports_its_version(sampler, adapters):
    model, exported = adapters[1]
    assert (
        sampler.generate([PROMPTS[0]], {"max_tokens": 2})[0]["completions"][0][
            "weight_version_start"
        ]
        == 0
    )  # before any adapter: the base
    report = sampler.swap_weights(exported.items(), strategy="drain", version=4)
    assert report["strategy"] == "adapter" and report["weight_version"] == 4
    assert sampler.adapters() == {"default": [4]}

    diff = worst(engine_scores(sampler), scores(model))
    print(f"sampler prompt log-probs with the default adapter vs peft: {diff:.2e}")
    assert diff < TOLERANCE
    out = sampler.generate([PROMPTS[0]], {"max_tokens": 3})[0]["completions"][0]
    assert out["weight_version_start"] == out["weight_version_end"] == 4
    base = sampler.generate([PROMPTS[0]], {"max_tokens": 3}, adapter="base")
    assert base[0]["completions"][0]["weight_version_start"] == 0


def test_version_one_still_answers_after_versions_two_and_three(sampler, adapters):
    first = None
    for version in (1, 2, 3):
        sampler.load_adapter("m", version, adapters[version][1].items())
        if version == 1:
            first = engine_scores(sampler, adapter="m", adapter_version=1)
    assert first is not None
    # vLLM keeps 2 versions here: v1 was evicted and comes back from its directory
    again = engine_scores(sampler, adapter="m", adapter_version=1)
    latest = engine_scores(sampler, adapter="m")
    print(
        f"m@v1 before/after v2, v3: {worst(first, again):.2e}; v1 vs v3 {worst(first, latest):.3f}"
    )
    assert worst(first, again) < 1e-6
    assert worst(first, scores(adapters[1][0])) < TOLERANCE  # v1 is adapter 1, not a copy
    assert worst(latest, scores(adapters[3][0])) < TOLERANCE
    assert worst(first, latest) > 1e-3
    assert sampler.adapters()["m"] == [1, 2, 3]
    assert (sampler.adapter_store.root / "m" / "v1" / "adapter_config.json").is_file()


def test_generate_in_flight_finishes_on_its_version_while_a_new_one_loads(sampler, adapters):
    sampler.load_adapter("live", 1, adapters[1][1].items())
    params = {"max_tokens": 400, "ignore_eos": True, "temperature": 0.0}
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(out=sampler.generate([PROMPTS[1]], params, adapter="live"))
    )
    thread.start()
    deadline = time.monotonic() + 120
    while sampler.loop.counts()["running_requests"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    report = sampler.load_adapter("live", 2, adapters[2][1].items())
    thread.join(timeout=300)
    print(
        f"loaded live@v2 in {report['load_seconds']:.3f} s, "
        f"{report['requests_in_flight']} request(s) in flight"
    )
    assert report["requests_in_flight"] == 1
    completion = result["out"][0]["completions"][0]
    assert completion["weight_version_start"] == completion["weight_version_end"] == 1
    rerun = sampler.generate([PROMPTS[1]], params, adapter="live", adapter_version=1)
    assert completion["token_ids"] == rerun[0]["completions"][0]["token_ids"]
    newer = sampler.generate([PROMPTS[1]], params, adapter="live")[0]["completions"][0]
    assert newer["weight_version_start"] == 2


def test_unknown_adapter_or_version_is_not_found_naming_what_is_loaded(sampler, scorer):
    with pytest.raises(NotFoundError, match=r"'nobody'.*loaded: \{"):
        sampler.generate([PROMPTS[0]], {"max_tokens": 1}, adapter="nobody")
    with pytest.raises(NotFoundError, match="no version 99"):
        scorer.log_probs(PROMPTS, COMPLETIONS, 0, adapter="a", adapter_version=99)


def test_full_weights_into_a_lora_job_are_refused_and_nothing_changes(sampler, tiny_model_path):
    import transformers

    state = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    before = sampler.adapters()
    with pytest.raises(InvalidRequestError, match="full-weight sync into a LoRA job"):
        sampler.swap_weights(state.items(), strategy="hotswap")
    assert sampler.adapters() == before


def test_bad_adapters_are_refused(sampler, adapters):
    exported = adapters[1][1]
    with pytest.raises(InvalidRequestError, match="already loaded"):
        sampler.load_adapter("m", 1, exported.items())
    with pytest.raises(InvalidRequestError, match="reserved"):
        sampler.load_adapter("base", 1, exported.items())
    big = {
        k: torch.zeros(16, v.shape[1]) if "lora_A" in k else torch.zeros(v.shape[0], 16)
        for k, v in exported.items()
    }
    with pytest.raises(InvalidRequestError, match="above this job's max_lora_rank 8"):
        sampler.load_adapter("big", 1, big.items())
    bogus = {"base_model.model.model.nothing.lora_A.weight": torch.zeros(RANK, 4)}
    with pytest.raises(InvalidRequestError, match="vLLM refused"):
        sampler.load_adapter("bogus", 1, bogus.items())
    assert "big" not in sampler.adapters() and "bogus" not in sampler.adapters()
    assert not (sampler.adapter_store.root / "bogus" / "v1").exists()


def test_removed_versions_are_gone_from_vllm_and_disk(sampler, adapters):
    sampler.load_adapter("gone", 1, adapters[1][1].items())
    path = sampler.adapter_store.root / "gone" / "v1"
    assert path.is_dir()
    assert sampler.remove_adapter("gone") == {"adapter": "gone", "removed_versions": [1]}
    assert "gone" not in sampler.adapters() and not path.exists()
    with pytest.raises(NotFoundError):
        sampler.generate([PROMPTS[0]], {"max_tokens": 1}, adapter="gone")


def test_weight_norm_counts_the_base_and_the_default_adapter(sampler, adapters, tiny_model_path):
    import math

    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tensors = [*base.state_dict().values(), *adapters[1][1].values()]
    expected = math.sqrt(sum(float(t.double().square().sum()) for t in tensors))
    assert sampler.weight_norm() == pytest.approx(expected, rel=1e-9)


def test_served_weight_norm_reads_the_base_back_and_adds_the_default_adapter(sampler):
    report = sampler.served_weight_norm()
    print(f"served_weight_norm {report['norm']:.6f} vs weight_norm {sampler.weight_norm():.6f}")
    assert report["adapter"] == "default@v4"
    assert report["norm"] == pytest.approx(sampler.weight_norm(), rel=1e-6)


def test_sleep_level_two_is_refused_in_lora_mode(sampler):
    with pytest.raises(InvalidRequestError, match="cannot load again"):
        sampler.sleep(level=2)


def test_one_batch_mixing_two_adapters_and_the_base_serves_each_its_own(sampler):
    from vllm.inputs import TokensPrompt

    from arctic_rl_engines.vllm_sampling import SamplingSpec

    alone = {
        name: engine_scores(sampler, adapter=name, adapter_version=version)
        for name, version in (("m", 3), ("live", 2), ("base", None))
    }
    requests = [
        sampler.adapter_store.resolve("m", 3).request,
        sampler.adapter_store.resolve("live", 2).request,
        None,
    ]
    spec = SamplingSpec.parse({"max_tokens": 1, "prompt_logprobs": True, "temperature": 0.0})
    pairs = [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    for order in ([0, 1, 2], [2, 0, 1]):
        prompts = [TokensPrompt(prompt_token_ids=pairs[i]) for i in order]
        loras = [requests[i] for i in order]
        call = sampler.loop.submit(prompts, spec.per_prompt(3), loras)
        outputs = sampler.loop.wait(call)
        for i, output in zip(order, outputs, strict=True):
            name = ("m", "live", "base")[i]
            got = [
                float(step[t].logprob)
                for t, step in zip(
                    pairs[i][len(PROMPTS[i]) :],
                    output.prompt_logprobs[len(PROMPTS[i]) :],
                    strict=True,
                )
            ]
            assert max_diff(got, alone[name][i]) < TOLERANCE, (name, order)
