"""LoRA adapter tensors on the wire: the name rule and the shapes a receiver expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arctic_platform.rl.errors import InvalidRequestError
from arctic_platform.rl.weight_sync.adapters import (
    adapter_bytes,
    expected_adapter,
    is_lora_tensor,
    lora_settings,
)
from arctic_platform.rl.weight_sync.buckets import expected_from_checkpoint

TARGETS = ["q_proj", "down_proj", "lm_head"]


def _checkpoint(folder: Path, tensors: dict[str, list[int]], tied: bool = False) -> Path:
    """A checkpoint directory whose safetensors file holds only a header (enough for
    ``expected_from_checkpoint``), and a config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    header = json.dumps(
        {
            name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}
            for name, shape in tensors.items()
        }
    ).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    return folder


LAYER = {
    "model.embed_tokens.weight": [425, 128],
    "model.layers.0.input_layernorm.weight": [128],
    "model.layers.0.self_attn.q_proj.weight": [128, 128],
    "model.layers.0.self_attn.k_proj.weight": [64, 128],
    "model.layers.0.mlp.down_proj.weight": [128, 256],
    "model.norm.weight": [128],
}


def test_adapter_tensors_of_each_targeted_linear_have_peft_names_and_lora_shapes(tmp_path):
    model = _checkpoint(tmp_path / "m", {**LAYER, "lm_head.weight": [425, 128]})
    got = expected_adapter(expected_from_checkpoint(model), 8, TARGETS, model)
    prefix = "base_model.model.model.layers.0."
    assert got == {
        f"{prefix}self_attn.q_proj.lora_A.weight": ((8, 128), None),
        f"{prefix}self_attn.q_proj.lora_B.weight": ((128, 8), None),
        f"{prefix}mlp.down_proj.lora_A.weight": ((8, 256), None),
        f"{prefix}mlp.down_proj.lora_B.weight": ((128, 8), None),
        "base_model.model.lm_head.lora_A.weight": ((8, 128), None),
        "base_model.model.lm_head.lora_B.weight": ((425, 8), None),
    }
    assert all(is_lora_tensor(name) for name in got)
    assert adapter_bytes(got, 4) == 4 * 8 * (128 + 128 + 256 + 128 + 128 + 425)


def test_a_tied_lm_head_gets_the_input_embeddings_shape(tmp_path):
    model = _checkpoint(tmp_path / "tied", LAYER, tied=True)
    got = expected_adapter(expected_from_checkpoint(model), 4, ["lm_head"], model)
    assert got == {
        "base_model.model.lm_head.lora_A.weight": ((4, 128), None),
        "base_model.model.lm_head.lora_B.weight": ((425, 4), None),
    }


def test_targets_that_match_no_linear_layer_are_refused(tmp_path):
    model = _checkpoint(tmp_path / "m", LAYER)
    with pytest.raises(InvalidRequestError, match="match no linear layer"):
        expected_adapter(expected_from_checkpoint(model), 8, ["embed_tokens", "nope"], model)


def test_the_name_rule_takes_only_lora_a_and_b_weights():
    assert is_lora_tensor("base_model.model.lm_head.lora_B.weight")
    assert not is_lora_tensor("model.layers.0.self_attn.q_proj.weight")
    assert not is_lora_tensor("base_model.model.lm_head.base_layer.weight")
    assert not is_lora_tensor("x.lora_A.default.weight")


def test_a_job_is_in_lora_mode_when_its_training_config_has_lora():
    assert lora_settings({"training_config": {"lora": {"rank": 8}}}) == {"rank": 8}
    assert lora_settings({"training_config": {"lora": None}}) is None
    assert lora_settings({"training_config": None}) is None
    assert lora_settings({}) is None


def test_the_default_tiny_model_at_rank_8_has_30_adapter_tensors_of_156960_bytes(tmp_path):
    pytest.importorskip("transformers")
    from arctic_platform.rl.config import DEFAULT_LORA_TARGETS
    from arctic_platform.rl.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    full = expected_from_checkpoint(model)
    got = expected_adapter(full, 8, DEFAULT_LORA_TARGETS, model)
    assert len(got) == 30 and adapter_bytes(got, 4) == 156_960
    assert adapter_bytes(full, 4) == 1_748_480
