"""The vLLM engines' LoRA parts that need no engine: names, engine arguments, tensor checks,
PEFT directories and the versions an adapter store resolves."""

from __future__ import annotations

import json

import pytest

from arctic_platform.rl.api import DEFAULT_ADAPTER, LoraConfig
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import InvalidRequestError, NotFoundError
from arctic_rl_engines.lora_names import bad_adapter_name, is_lora_tensor, vllm_adapter_name
from arctic_rl_engines.vllm_common import engine_kwargs
from arctic_rl_engines.vllm_lora import AdapterStore, LoraServing, adapter_tensors

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

Q = "base_model.model.model.layers.0.self_attn.q_proj"


def config(lora: dict | None = None, **vllm: object) -> ArcticRLClientConfig:
    training = None if lora is None else {"lora": lora}
    return ArcticRLClientConfig(
        model_name="/models/tiny",
        sampling_gpus=1,
        host="127.0.0.1",
        port=7000,
        vllm_config=vllm or None,
        training_config=training,
    )


def adapter(rank: int = 8, scale: float = 1.0) -> dict[str, object]:
    return {
        f"{Q}.lora_A.weight": scale * torch.ones(rank, 16),
        f"{Q}.lora_B.weight": scale * torch.ones(32, rank),
    }


def test_lora_tensor_names_are_peft_export_names():
    assert is_lora_tensor(f"{Q}.lora_A.weight") and is_lora_tensor(f"{Q}.lora_B.weight")
    assert not is_lora_tensor("model.layers.0.self_attn.q_proj.weight")
    assert not is_lora_tensor("base_model.model.lm_head.base_layer.weight")
    assert vllm_adapter_name("tenant", 3) == "tenant@v3"


def test_adapter_names_refuse_base_paths_and_empties():
    assert bad_adapter_name("tenant-1.a") is None
    for bad in ("base", "", "../x", "a/b", ".hidden", 3):
        assert bad_adapter_name(bad)


def test_lora_mode_starts_vllm_with_lora_arguments_that_vllm_config_overrides():
    assert "enable_lora" not in engine_kwargs(config(), cuda=False)
    kwargs = engine_kwargs(config({"rank": 12}), cuda=False)
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 16
    assert (kwargs["max_loras"], kwargs["max_cpu_loras"]) == (4, 16)
    kwargs = engine_kwargs(config({"rank": 8}, max_loras=2, max_cpu_loras=3), cuda=False)
    assert (kwargs["max_loras"], kwargs["max_cpu_loras"]) == (2, 3)


def test_adapter_tensors_give_their_rank_and_refuse_what_is_not_an_adapter():
    tensors, rank = adapter_tensors(adapter(4).items(), max_rank=8)
    assert rank == 4 and set(tensors) == set(adapter(4))
    with pytest.raises(InvalidRequestError, match="full-weight sync into a LoRA job"):
        adapter_tensors([("model.embed_tokens.weight", torch.zeros(4, 4))], 8)
    with pytest.raises(InvalidRequestError, match="above this job's max_lora_rank 8"):
        adapter_tensors(adapter(16).items(), 8)
    mixed = {**adapter(4), f"{Q}.lora_B.weight": torch.zeros(32, 2)}
    with pytest.raises(InvalidRequestError, match="mixed ranks"):
        adapter_tensors(mixed.items(), 8)
    with pytest.raises(InvalidRequestError, match="no tensors"):
        adapter_tensors([], 8)


def test_store_writes_a_peft_dir_with_the_configs_alpha_and_targets(tmp_path):
    lora = LoraConfig(rank=8, alpha=16, target_modules=["q_proj", "lm_head"])
    store = AdapterStore(lora, 8, tmp_path)
    entry = store.prepare("t", 2, adapter(8).items())
    store.commit(entry)

    assert entry.path == tmp_path / "adapters" / "t" / "v2"
    written = json.loads((entry.path / "adapter_config.json").read_text())
    assert (written["r"], written["lora_alpha"]) == (8, 16)
    assert sorted(written["target_modules"]) == ["lm_head", "q_proj"]
    assert (entry.path / "adapter_model.safetensors").is_file()
    assert entry.request.lora_name == "t@v2" and entry.bytes == (8 * 16 + 32 * 8) * 4
    assert not any(p.name.startswith(".") for p in entry.path.parent.iterdir())


def test_store_resolves_default_latest_base_and_named_versions(tmp_path):
    store = AdapterStore(LoraConfig(rank=8), 8, tmp_path)
    assert store.resolve(None, None) is None  # before any sync: the base
    for name, version in ((DEFAULT_ADAPTER, 1), (DEFAULT_ADAPTER, 2), ("t", 5)):
        store.commit(store.prepare(name, version, adapter().items()))

    assert store.resolve(None, None).version == 2
    assert store.resolve(None, 1).request.lora_name == "default@v1"
    assert store.resolve("t", None).version == 5
    assert store.resolve("base", None) is None
    assert store.listing() == {"default": [1, 2], "t": [5]}
    with pytest.raises(NotFoundError, match=r"'x' is not loaded.*'default': \[1, 2\]"):
        store.resolve("x", None)
    with pytest.raises(NotFoundError, match="no version 3"):
        store.resolve("t", 3)
    with pytest.raises(InvalidRequestError, match="no versions"):
        store.resolve("base", 1)


def test_store_ids_are_fresh_and_versions_immutable(tmp_path):
    store = AdapterStore(LoraConfig(rank=8), 8, tmp_path)
    first = store.prepare("t", 1, adapter().items())
    store.commit(first)
    with pytest.raises(InvalidRequestError, match="already loaded"):
        store.prepare("t", 1, adapter().items())
    second = store.prepare("t", 2, adapter().items())
    assert second.request.lora_int_id != first.request.lora_int_id


def test_a_refused_prepare_leaves_nothing_behind(tmp_path):
    store = AdapterStore(LoraConfig(rank=8), 8, tmp_path)
    with pytest.raises(InvalidRequestError):
        store.prepare("t", 1, [("model.norm.weight", torch.ones(4, 4))])
    entry = store.prepare("t", 1, adapter().items())  # the version is free again
    store.discard(entry)
    assert not entry.path.exists() and store.listing() == {}


def test_removing_forgets_versions_and_deletes_their_dirs(tmp_path):
    store = AdapterStore(LoraConfig(rank=8), 8, tmp_path)
    for version in (1, 2):
        store.commit(store.prepare("t", version, adapter().items()))
    removed = store.remove("t", 1)
    store.delete(removed)
    assert store.listing() == {"t": [2]} and not removed[0].path.exists()
    store.delete(store.remove("t"))
    assert store.listing() == {} and not (tmp_path / "adapters" / "t").exists()
    with pytest.raises(NotFoundError):
        store.remove("t")


def test_a_temporary_store_is_removed_on_close():
    store = AdapterStore(LoraConfig(rank=8), 8)
    store.commit(store.prepare("t", 1, adapter().items()))
    assert store.root.is_dir()
    store.close()
    assert not store.root.parent.exists()


def test_full_mode_refuses_adapters_and_adapter_tensors():
    serving = LoraServing()
    assert serving._lora_request(None, None) == (None, None)
    assert serving._lora_request("base", None) == (None, None)
    with pytest.raises(InvalidRequestError, match="needs a LoRA job"):
        serving._lora_request("t", None)
    with pytest.raises(InvalidRequestError, match="needs a LoRA job"):
        serving.load_adapter("t", 1, adapter().items())
    with pytest.raises(InvalidRequestError, match="sent to a full-weight job"):
        serving._refuse_adapter_tensors(["model.norm.weight", f"{Q}.lora_A.weight"])
    assert serving.adapters() == {}
