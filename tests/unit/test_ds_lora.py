"""LoRA mode of the DeepSpeed engines without DeepSpeed: peft wrapping, export names, the
adapter_config.json both sides write, and the checkpoint-mode checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from arctic_platform.rl.api import (  # noqa: E402
    CheckpointError,
    EngineConfigError,
    InvalidRequestError,
    LoraConfig,
)
from arctic_rl_engines import ds_lora  # noqa: E402
from arctic_rl_engines.lora_format import adapter_config_dict  # noqa: E402


class Block(torch.nn.Module):
    """Attention- and MLP-named linear layers, like one decoder layer."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(8, 8, bias=False)
        self.up_proj = torch.nn.Linear(8, 12, bias=False)
        self.down_proj = torch.nn.Linear(12, 8, bias=False)


class Toy(torch.nn.Module):
    """Two blocks and an unembedding; ``forward`` maps (n, 8) to (n, 5)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(8)
        self.lm_head = torch.nn.Linear(8, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = x + block.down_proj(torch.relu(block.up_proj(block.q_proj(x))))
        return self.lm_head(self.norm(x))


TARGETS = ["q_proj", "up_proj", "down_proj", "lm_head"]


def lora(**kw) -> LoraConfig:
    return LoraConfig(**{"rank": 4, "alpha": 8, "target_modules": TARGETS, **kw})


def test_a_fresh_adapter_equals_the_base_and_only_it_trains() -> None:
    x = torch.randn(3, 8)
    model = Toy()
    before = model(x)
    wrapped = ds_lora.wrap(model, lora(seed=5), seed=0)
    assert torch.equal(wrapped(x), before)  # lora_B = 0: bit-identical
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert len(trainable) == len(ds_lora.trainable(wrapped)) == 2 * (3 * 2 + 1)


def test_the_lora_seed_draws_A_without_moving_the_callers_rng() -> None:
    def a_matrices(cfg: LoraConfig, seed: int, model: Toy | None = None) -> list[torch.Tensor]:
        wrapped = ds_lora.wrap(model or Toy(), cfg, seed=seed)
        return [p.detach().clone() for n, p in wrapped.named_parameters() if "lora_A" in n]

    model = Toy()
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = a_matrices(lora(seed=7), seed=0, model=model)
    assert torch.equal(torch.rand(1), expected_next)
    same = a_matrices(lora(seed=7), seed=99)
    other = a_matrices(lora(seed=8), seed=0)
    by_run_seed = a_matrices(lora(), seed=7)
    assert all(torch.equal(a, b) for a, b in zip(first, same, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(first, by_run_seed, strict=True))
    assert not torch.equal(first[0], other[0])


def test_export_is_the_adapter_under_peft_names_with_sizes() -> None:
    wrapped = ds_lora.wrap(Toy(), lora(), seed=0)
    tensors = ds_lora.export(wrapped)
    assert len(tensors) == 14
    assert all(n.startswith("base_model.model.") for n in tensors)
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in tensors)
    assert not any("base_layer" in n or ".default." in n for n in tensors)
    assert tuple(tensors["base_model.model.lm_head.lora_A.weight"].shape) == (4, 8)
    assert tuple(tensors["base_model.model.lm_head.lora_B.weight"].shape) == (5, 4)
    info = ds_lora.info(lora(), wrapped, "float32")
    params = sum(t.numel() for t in tensors.values())
    assert info["tensors"] == 14 and info["params"] == params and info["bytes"] == 4 * params
    assert ds_lora.info(lora(), wrapped, "bfloat16")["bytes"] == 2 * params


def test_unknown_target_modules_name_what_the_model_has() -> None:
    dotted = ds_lora.wrap(Toy(), lora(target_modules=["layers.1.q_proj", "lm_head"]), seed=0)
    assert len(ds_lora.lora_parameters(dotted)) == 4  # a dotted suffix names one layer
    with pytest.raises(EngineConfigError) as err:
        ds_lora.wrap(Toy(), lora(target_modules=["q_proj", "o_proj", "norm"]), seed=0)
    text = str(err.value)
    assert "['o_proj', 'norm']" in text
    assert "['down_proj', 'lm_head', 'q_proj', 'up_proj']" in text


def test_adapter_config_is_a_plain_lora_and_keeps_the_scaling_when_padded() -> None:
    cfg = adapter_config_dict(lora(alpha=16, rank=4), 4, base_model="/m")
    assert json.loads(json.dumps(cfg)) == cfg
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 16 and cfg["bias"] == "none"
    assert cfg["peft_type"] == "LORA" and cfg["target_modules"] == sorted(TARGETS)
    assert not cfg["use_rslora"] and not cfg["use_dora"] and cfg["modules_to_save"] is None
    padded = adapter_config_dict(lora(alpha=6, rank=3), 8)
    assert padded["r"] == 8 and padded["lora_alpha"] == 16  # 6 / 3 == 16 / 8
    assert adapter_config_dict(lora(alpha=5, rank=4), 4)["lora_alpha"] == 5
    assert adapter_config_dict(lora(alpha=5, rank=4), 8)["lora_alpha"] == 10
    assert adapter_config_dict(lora(alpha=5, rank=3), 3)["lora_alpha"] == 5
    with pytest.raises(InvalidRequestError, match="below the adapter's rank"):
        adapter_config_dict(lora(rank=8), 4)


def test_adapter_config_is_accepted_by_peft() -> None:
    import peft

    cfg = adapter_config_dict(lora(alpha=16), 4)
    loaded = peft.LoraConfig.from_peft_type(**cfg)
    assert loaded.r == 4 and loaded.lora_alpha == 16
    assert set(loaded.target_modules) == set(TARGETS)


def test_save_adapter_writes_a_peft_directory_peft_loads(tmp_path: Path) -> None:
    import peft

    wrapped = ds_lora.wrap(Toy(), lora(seed=1), seed=0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_()
    x = torch.randn(2, 8)
    want = wrapped(x)
    folder = ds_lora.save_adapter(tmp_path / "adapter", ds_lora.export(wrapped), lora(), "toy")
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    from safetensors.torch import load_file

    config = peft.LoraConfig.from_pretrained(str(folder))
    assert config.r == 4 and config.lora_alpha == 8 and config.base_model_name_or_path == "toy"
    fresh = ds_lora.wrap(Toy(), lora(seed=2), seed=0)
    assert not torch.equal(fresh(x), want)
    result = peft.set_peft_model_state_dict(
        fresh, load_file(str(folder / "adapter_model.safetensors"))
    )
    assert not result.unexpected_keys
    assert torch.equal(fresh(x), want)


def test_checkpoint_modes_must_match(tmp_path: Path) -> None:
    mine = lora()
    as_lora = ds_lora.marker_fields(mine, "/base")
    assert as_lora["base_model"] == "/base" and as_lora["lora"]["rank"] == 4
    ds_lora.check_mode(as_lora, lora(seed=3, dropout=0.1), tmp_path)  # seed, dropout free
    ds_lora.check_mode(ds_lora.marker_fields(None, "/base"), None, tmp_path)
    ds_lora.check_mode({}, None, tmp_path)  # markers from before LoRA existed
    with pytest.raises(CheckpointError, match=r"is a LoRA checkpoint .* trains full weights"):
        ds_lora.check_mode(as_lora, None, tmp_path)
    with pytest.raises(CheckpointError, match=r"is a full-weight checkpoint .* LoRA adapter"):
        ds_lora.check_mode({"lora": None}, mine, tmp_path)
    with pytest.raises(CheckpointError, match=r"rank 4, alpha 8.0.*rank 8"):
        ds_lora.check_mode(as_lora, lora(rank=8), tmp_path)


def test_vllm_accepts_the_adapter_config() -> None:
    helper_mod = pytest.importorskip("vllm.lora.peft_helper")
    lora_config = pytest.importorskip("vllm.config.lora")
    cfg = adapter_config_dict(LoraConfig(rank=8, alpha=16), 8)
    helper = helper_mod.PEFTHelper.from_dict(cfg)
    helper.validate_legal(lora_config.LoRAConfig(max_lora_rank=8))
    assert helper.vllm_lora_scaling_factor == 2.0


def test_export_and_parameter_names_round_trip() -> None:
    from arctic_rl_engines.ds_adapters import export_name

    param = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    exported = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    assert export_name(param) == exported and ds_lora.param_name(exported) == param


def test_served_versions_resolve_like_the_vllm_side() -> None:
    from arctic_platform.rl.api import NotFoundError
    from arctic_rl_engines.ds_lora_serving import AdapterServing

    serving = AdapterServing()
    serving._lora = lora()
    serving._serving_start()
    assert serving._resolve(None, None) is None  # nothing synced yet: the base
    serving._served = {"default": {1: {}, 3: {}}, "x": {2: {}}}
    assert serving._resolve(None, None) == ("default", 3)
    assert serving._resolve(None, 1) == ("default", 1)
    assert serving._resolve("x", None) == ("x", 2)
    assert serving._resolve("base", None) is None
    assert serving._next_default_version() == 4
    with pytest.raises(NotFoundError, match=r"'y' is not loaded; loaded: \{'default': \[1, 3\]"):
        serving._resolve("y", None)
    with pytest.raises(NotFoundError, match="has no version 5"):
        serving._resolve("x", 5)
    assert serving.remove_adapter("default", 1)["adapters"] == {"default": [3], "x": [2]}
    serving.remove_adapter("x")
    assert serving.adapters() == {"default": [3]}
    with pytest.raises(NotFoundError, match="adapter 'x' is not loaded"):
        serving.remove_adapter("x")
