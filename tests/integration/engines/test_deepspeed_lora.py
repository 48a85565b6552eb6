"""LoRA mode of the DeepSpeed training engine on CPU: the adapter trains, exports, checkpoints.

One ZeRO-0 engine (rank 8, alpha 16, default targets) serves the module's tests in order:
step 0 (adapter = base), training, checkpoints and resume, the log-prob job serving the
adapter, and last named adapters (``adapter=``). The 2-rank ZeRO-0/ZeRO-3 runs are a world of
two processes (``ds_world_worker.py``) compared with each other and a one-process run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_deepspeed_training import make_batch, make_engine, max_weight_diff, weights
from test_deepspeed_world2 import make_spec, run_world

pytest.importorskip("deepspeed")
pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from arctic_platform.rl.errors import (  # noqa: E402
    CheckpointError,
    EngineConfigError,
    InvalidRequestError,
    NotFoundError,
)

pytestmark = pytest.mark.slow

LORA = {"rank": 8, "alpha": 16, "seed": 3}
TRAINING = {"optimizer": {"lr": 1e-2}, "lora": LORA}
EXPORT_NAME = re.compile(r"^base_model\.model\..+\.lora_[AB]\.weight$")
STEPS = 3


def lora_engine(model_path: str, **options: Any) -> Any:
    """A LoRA training engine on the tiny model (``training`` overrides merge into TRAINING)."""
    return make_engine(model_path, training={**TRAINING, **options.pop("training", {})}, **options)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared engine's checkpoint root."""
    return tmp_path_factory.mktemp("lora-checkpoints")


@pytest.fixture(scope="module")
def engine(tiny_model_path: str, root: Path) -> Any:
    """The module's ZeRO-0 LoRA engine; tests use it in file order (step 0 first)."""
    built = lora_engine(tiny_model_path, checkpoint_path=str(root))
    yield built
    built.close()


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for r, s in zip(a, b, strict=True) for x, y in zip(r, s, strict=True))


def test_a_fresh_adapter_is_30_tensors_and_the_base_exactly(
    engine: Any, tiny_model_path: str
) -> None:
    from arctic_rl_engines.logprobs import rows_log_probs

    adapter = weights(engine)
    params = sum(t.numel() for t in adapter.values())
    size = sum(t.numel() * t.element_size() for t in adapter.values())
    print(f"adapter: {len(adapter)} tensors, {params} params, {size} bytes")
    assert (len(adapter), params, size) == (30, 39_240, 156_960)
    assert all(EXPORT_NAME.match(n) and "base_layer" not in n for n in adapter)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in adapter.values())
    assert all(not t.any() for n, t in adapter.items() if "lora_B" in n)
    info = engine.lora_info()
    assert info == {
        "rank": 8,
        "alpha": 16.0,
        "target_modules": list(engine.config.training_config.lora.target_modules),
        "tensors": 30,
        "params": 39_240,
        "bytes": 156_960,
    }
    config = engine.adapter_config()
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["bias"] == "none"
    # Step 0: the trainer, its KL reference and the plain base model agree bit for bit.
    batch = make_batch(5)
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    plain = rows_log_probs(
        base.eval(),
        [list(r) for r in batch["input_ids"]],
        device=torch.device("cpu"),
        pad_id=engine._pad_id,
        max_tokens=None,
        rank=0,
        world=1,
    )
    trainer = engine.fwd_no_grad(batch)
    assert trainer == engine.fwd_no_grad(batch, reference_model=True)
    assert trainer == [r.log_probs for r in plain]


def test_training_moves_only_the_adapter_and_the_reference_stays_the_base(engine: Any) -> None:
    batch = make_batch(5)
    reference = engine.fwd_no_grad(batch, reference_model=True)
    frozen = {
        n: p.detach().clone()
        for n, p in engine._engine.module.named_parameters()
        if ".lora_" not in n
    }
    assert all(not p.requires_grad for p in frozen.values())
    losses = []
    for _ in range(STEPS):
        losses.append(engine.fwd_bwd(make_batch(0), "cross_entropy")["loss"])
        assert engine.step()["applied"]
    print("LoRA loss curve:", [round(x, 4) for x in losses])
    assert losses[-1] < losses[0]
    after = dict(engine._engine.module.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in frozen.items())
    assert engine.fwd_no_grad(batch, reference_model=True) == reference
    moved = max_diff(engine.fwd_no_grad(batch), reference)
    print(f"trainer vs base after {STEPS} steps: max |dlogp| = {moved:.4f}")
    assert moved > 1e-3
    assert any(t.any() for n, t in weights(engine).items() if "lora_B" in n)
    assert engine._reference is None  # no second model was loaded


def test_a_checkpoint_is_the_adapter_and_resumes_exactly(
    engine: Any, root: Path, tiny_model_path: str
) -> None:
    path = Path(engine.save_checkpoint(str(root)))
    assert sorted(p.name for p in path.iterdir()) == [
        "adapter",
        "arctic_rl_checkpoint.json",
        "deepspeed",
        "rng",
    ]
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"LoRA checkpoint: {size} bytes")
    assert size < 2_000_000
    marker = json.loads((path / "arctic_rl_checkpoint.json").read_text())
    assert marker["lora"]["rank"] == 8 and marker["base_model"] == tiny_model_path
    assert marker["adapter"] == "default"
    from safetensors.torch import load_file

    saved = weights(engine)
    on_disk = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    assert max_weight_diff(on_disk, saved) == 0.0
    config = json.loads((path / "adapter" / "adapter_config.json").read_text())
    assert config == engine.adapter_config()

    def two_steps() -> list[float]:
        seen = []
        for i in range(2):
            seen.append(engine.fwd_bwd(make_batch(10 + i), "cross_entropy")["loss"])
            seen.append(engine.step()["grad_norm"])
        return seen

    straight = two_steps()
    assert max_weight_diff(weights(engine), saved) > 0
    assert engine.load_checkpoint(str(root)) == STEPS
    assert max_weight_diff(weights(engine), saved) == 0.0
    resumed = two_steps()
    print("after save vs after load:", straight, resumed)
    assert resumed == pytest.approx(straight, abs=1e-6, rel=0)
    # Weights only (Tinker's load_state): the same weights, AdamW starting afresh.
    assert engine.load_checkpoint(str(path), optimizer=False) == STEPS
    assert max_weight_diff(weights(engine), saved) == 0.0
    fresh = two_steps()
    assert fresh[:2] == straight[:2] and abs(fresh[2] - straight[2]) > 1e-4
    # A new job on the same root resumes the newest checkpoint: the base plus the adapter.
    engine.load_checkpoint(str(path))
    again = lora_engine(tiny_model_path, checkpoint_path=str(root))
    try:
        assert again.global_step == STEPS
        assert max_weight_diff(weights(again), saved) == 0.0
        assert again.weight_norm() == pytest.approx(engine.weight_norm(), rel=1e-12)
    finally:
        again.close()


def test_lora_and_full_checkpoints_refuse_the_other_mode(
    engine: Any, root: Path, tiny_model_path: str, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError, match="is a LoRA checkpoint"):
        make_engine(tiny_model_path, checkpoint_path=str(root))
    full = make_engine(tiny_model_path, checkpoint_path=str(tmp_path))
    try:
        full_path = full.save_checkpoint(str(tmp_path))
        assert full.lora_info() is None and full.adapter_config() is None
        assert full.adapters() == []
        with pytest.raises(InvalidRequestError, match="trains full weights, not adapters"):
            full.fwd_no_grad(make_batch(0), adapter="default")
        with pytest.raises(InvalidRequestError, match="trains full weights, not adapters"):
            full.add_adapter("b")
        with pytest.raises(CheckpointError, match="is a LoRA checkpoint"):
            full.load_checkpoint(str(root))
    finally:
        full.close()
    with pytest.raises(CheckpointError, match="is a full-weight checkpoint"):
        engine.load_checkpoint(full_path)
    with pytest.raises(CheckpointError, match=r"rank 8, alpha 16\.0"):
        lora_engine(tiny_model_path, checkpoint_path=str(root), training={"lora": {"rank": 4}})


def log_prob_engine(model_path: str, lora: bool = True, **options: Any) -> Any:
    """The ``deepspeed`` log-prob engine, in LoRA mode unless ``lora`` is False."""
    from engine_build import registry_engine

    from arctic_platform.rl.config import ArcticRLClientConfig, TrainingConfig

    config = ArcticRLClientConfig(
        model_name=model_path,
        log_prob_gpus=1,
        log_prob_engine="deepspeed",
        training_config=TrainingConfig.model_validate(TRAINING if lora else {}),
        **options,
    )
    return registry_engine("deepspeed", "log_prob", config)


def test_the_deepspeed_log_prob_job_serves_the_adapter(
    engine: Any, root: Path, tiny_model_path: str
) -> None:
    batch = make_batch(5)
    trainer, base = engine.fwd_no_grad(batch), engine.fwd_no_grad(batch, reference_model=True)
    adapter = weights(engine)
    served = log_prob_engine(tiny_model_path)
    try:
        assert served.fwd_no_grad(batch) == base  # a fresh adapter is the base
        served.load_weights(adapter.items())
        assert max_weight_diff(weights(served), adapter) == 0.0
        diff = max_diff(served.fwd_no_grad(batch), trainer)
        print(f"log-prob job vs trainer with the adapter: max |diff| = {diff:.1e}")
        assert diff <= 1e-6
        embed = ("model.embed_tokens.weight", torch.zeros(425, 128))
        with pytest.raises(InvalidRequestError, match="full-weight sync into a LoRA job"):
            served.load_weights([embed, *adapter.items()])
        with pytest.raises(InvalidRequestError, match="26 of its tensors are missing"):
            served.load_weights(list(adapter.items())[:4])
        assert max_weight_diff(weights(served), adapter) == 0.0  # nothing was loaded
        # Named versions: each call is served by the version it names; None is the newest
        # default one, "base" the base.
        doubled = {n: t * 2 if "lora_B" in n else t for n, t in adapter.items()}
        served.load_adapter("x", 1, adapter.items())
        report = served.load_adapter("x", 2, doubled.items())
        assert report["bytes"] == 156_960 and report["weight_version"] == 2
        assert served.adapters() == {"default": [1], "x": [1, 2]}
        assert served.fwd_no_grad(batch, adapter="x", adapter_version=1) == trainer
        assert max_diff(served.fwd_no_grad(batch, adapter="x"), trainer) > 1e-3
        assert served.fwd_no_grad(batch, adapter="base") == base
        assert served.fwd_no_grad(batch, reference_model=True) == base
        prompts, completions = (
            [r[:3] for r in batch["input_ids"]],
            [r[3:] for r in batch["input_ids"]],
        )
        scored = served.log_probs(prompts, completions, top_k=0, adapter="x", adapter_version=1)
        assert [s["log_probs"] for s in scored] == [r[3:] for r in trainer]
        with pytest.raises(NotFoundError, match=r"adapter 'x' has no version 3"):
            served.fwd_no_grad(batch, adapter="x", adapter_version=3)
        with pytest.raises(NotFoundError, match=r"adapter 'y' is not loaded"):
            served.log_probs(prompts, completions, adapter="y")
        assert served.remove_adapter("x", 1)["adapters"] == {"default": [1], "x": [2]}
        assert served.fwd_no_grad(batch) == trainer
    finally:
        served.close()
    resumed = log_prob_engine(tiny_model_path, checkpoint_path=str(root))
    full = log_prob_engine(tiny_model_path, lora=False)
    try:
        assert max_diff(resumed.fwd_no_grad(batch), trainer) <= 1e-6
        with pytest.raises(InvalidRequestError, match="serves full weights"):
            full.load_weights(adapter.items())
    finally:
        resumed.close()
        full.close()


def test_unknown_target_modules_are_refused_naming_the_models_layers(tiny_model_path: str) -> None:
    lora = {**LORA, "target_modules": ["q_proj", "c_attn"]}
    with pytest.raises(EngineConfigError, match=r"\['c_attn'\] match no linear layer") as err:
        lora_engine(tiny_model_path, training={"lora": lora})
    assert "'down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj'" in str(err.value)


def test_zero3_on_two_ranks_exports_the_adapter_of_zero0(
    tiny_model_path: str, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    spec = make_spec(tiny_model_path, str(tmp_path / "checkpoints"))
    # AdamW's eps at 1e-4: its first steps divide each gradient by its own size, which turns
    # last-bit differences of near-zero gradients (ZeRO-3's linear backward sums in another
    # order) into lr-sized ones; with eps 1e-8 one element of a k_proj lora_B moved 3e-5
    # after a single step. The export itself is what this test checks.
    optimizer = {"lr": 1e-2, "eps": 1e-4}
    spec.update(stages=[0, 3], steps=STEPS, training={"optimizer": optimizer, "lora": LORA})
    ranks = run_world(spec, tmp_path)
    exported = {
        (rank, stage): load_file(str(tmp_path / f"rank{rank}.json.zero{stage}.safetensors"))
        for rank in (0, 1)
        for stage in (0, 3)
    }
    for stage in ("0", "3"):
        r0, r1 = ranks[0][stage], ranks[1][stage]
        assert r0["warnings"] == [] and r1["warnings"] == []  # peft's invalid-shape warning
        assert r0["losses"] == r1["losses"] and r0["lora_info"]["tensors"] == 30
        assert max_weight_diff(exported[0, int(stage)], exported[1, int(stage)]) == 0.0
        saved = load_file(str(Path(r0["checkpoint"]) / "adapter" / "adapter_model.safetensors"))
        assert max_weight_diff(saved, exported[0, int(stage)]) == 0.0
    # ZeRO-3 shards the adapter and empties it between uses: an ungathered export would be
    # the empty tensors peft warns about.
    assert all(r["3"]["local_lora_numel"] <= 39_240 / 2 + 64 and r["3"]["released"] for r in ranks)
    assert not any(r["0"]["released"] for r in ranks)
    # Many adapters in one job need ZeRO-0 (plain tensors the bank can swap): under ZeRO-3 a
    # second adapter is refused, naming what the job has, and the job keeps its one adapter.
    for r in ranks:
        assert r["0"]["second_adapter"] == {"error": None, "adapters": ["default", "second"]}
        refused = r["3"]["second_adapter"]
        assert refused["adapters"] == ["default"], refused
        assert refused["error"].startswith("EngineConfigError: many adapters in one training"), (
            refused
        )
        assert "this job: ZeRO 3, float32" in refused["error"], refused
    sharded = max_weight_diff(exported[0, 3], exported[0, 0])
    print(f"adapter after {STEPS} steps, 2 ranks, ZeRO-3 vs ZeRO-0: max |diff| = {sharded:.2e}")
    assert sharded <= 1e-6
    # One process on the whole batch (each rank above trained on rows rank::2).
    single = lora_engine(tiny_model_path, training={"optimizer": optimizer})
    try:
        ce = {k: spec["batch"][k] for k in ("input_ids", "loss_mask")}
        losses = []
        for _ in range(STEPS):
            losses.append(single.fwd_bwd(ce, "cross_entropy")["loss"])
            single.step()
        reference = weights(single)
    finally:
        single.close()
    whole = max_weight_diff(exported[0, 3], reference)
    print(f"2-rank ZeRO-3 vs 1-process ZeRO-0 adapter: max |diff| = {whole:.2e}")
    assert ranks[0]["3"]["losses"] == pytest.approx(losses, rel=1e-5)
    assert whole <= 1e-6


def test_named_adapters_train_apart_and_checkpoint_one_at_a_time(
    engine: Any, tmp_path: Path
) -> None:
    batch, other = make_batch(0), make_batch(7)
    base = engine.fwd_no_grad(batch, reference_model=True)
    default, default_step = weights(engine), engine.global_step
    assert engine.adapters() == ["default"]
    engine.add_adapter("b", seed=11)
    engine.add_adapter("c", seed=11)
    assert engine.adapters() == ["default", "b", "c"]
    fresh = dict(engine.named_weights(adapter="b"))
    assert fresh.keys() == default.keys()
    assert all(not t.any() for n, t in fresh.items() if "lora_B" in n)
    assert engine.fwd_no_grad(batch, adapter="b") == base  # a new adapter is the base
    assert engine.global_step == 0 and engine.adapters()[0] == "b"

    def train(adapter: str, rows: dict[str, Any]) -> float:
        loss = engine.fwd_bwd(rows, "cross_entropy", adapter=adapter)["loss"]
        engine.step(adapter=adapter)
        return loss

    # "b" trains with "default" stepping (and holding half-accumulated gradients) in between;
    # "c", the same start, trains alone: both end bit for bit the same.
    b_losses = [train("b", batch)]
    engine.fwd_bwd(other, "cross_entropy", adapter="default")
    b_losses.append(train("b", batch))
    assert engine.step(adapter="default")["applied"]
    c_losses = [train("c", batch), train("c", batch)]
    assert b_losses == c_losses
    assert max_weight_diff(weights(engine), dict(engine.named_weights(adapter="b"))) == 0.0
    assert engine.global_step == 2
    assert max_weight_diff(dict(engine.named_weights(adapter="default")), default) > 0
    # A checkpoint holds one adapter; loading it into another makes that one its copy.
    path = engine.save_checkpoint(str(tmp_path), adapter="b")
    marker = json.loads((Path(path) / "arctic_rl_checkpoint.json").read_text())
    assert marker["global_step"] == 2 and marker["adapter"] == "b"
    train("c", other)
    assert engine.load_checkpoint(path, adapter="c") == 2
    assert max_weight_diff(weights(engine), dict(engine.named_weights(adapter="b"))) == 0.0
    assert train("c", batch) == train("b", batch)
    with pytest.raises(NotFoundError, match=r"adapter 'nope' is not in this training job"):
        engine.fwd_bwd(batch, "cross_entropy", adapter="nope")
    with pytest.raises(InvalidRequestError, match="already exists"):
        engine.add_adapter("b")
    with pytest.raises(InvalidRequestError, match="reserved for the base model"):
        engine.add_adapter("base")
    engine.fwd_bwd(batch, "cross_entropy", adapter="b")
    assert engine.remove_adapter("b")["adapters"] == ["c", "default"]  # its gradients go too
    assert engine.step(adapter="c")["applied"] is False  # nothing of b's reached c
    engine.remove_adapter("c")
    assert engine.adapters() == ["default"] and engine.global_step == default_step + 1
    with pytest.raises(InvalidRequestError, match="last adapter"):
        engine.remove_adapter("default")
