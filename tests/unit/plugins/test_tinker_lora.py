"""The Tinker front-end in LoRA mode, over a recording stand-in for ``RLServer``: Tinker's
``LoraConfig`` becomes ``training_config.lora``, models of one base and LoRA shape share a pool
(one training and one sampling job, an adapter each), syncs and training calls name the model's
adapter, samplers ask for their adapter version, base samplers share a pool's sampling job, and
bad settings are refused before any job."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from arctic_platform.rl.api import InvalidRequestError
from arctic_rl_tinker.frontend import TinkerFrontend
from arctic_rl_tinker.gpu_seats import NoGpuRoomError
from arctic_rl_tinker.lora_models import check_base_model, lora_section


class RecordingServer:
    """Answers the operations the front-end sends and keeps every (name, payload)."""

    num_gpus = 1

    def __init__(self) -> None:
        self.shutdown_requested = threading.Event()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._jobs = 0
        self._versions: dict[tuple[int, str | None], int] = {}

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        payload = dict(payload or {})
        self.calls.append((name, payload))
        if name == "initialize":
            self._jobs += 1
            return {"job_id": self._jobs}
        if name == "get_job":
            version = self._versions.get((payload["job_id"], None), 0)
            return {"state": "running", "weight_version": version}
        if name == "sync_weights":
            key = (payload["sampling_job_ids"][0], payload.get("adapter"))
            self._versions[key] = self._versions.get(key, 0) + 1
            return {"weight_version": self._versions[key]}
        if name == "add_adapter":
            return {"adapter": payload["adapter"], "adapters": [payload["adapter"]]}
        if name == "save_checkpoint":
            return {"path": f"/ckpt/{payload['tag']}", "global_step": 1}
        if name == "generate":
            return {"outputs": [{"token_ids": [[1]], "log_probs": [[-0.5]]}] * 1}
        return {}

    def sent(self, name: str) -> list[dict[str, Any]]:
        """The payloads of every ``name`` call so far."""
        return [payload for called, payload in self.calls if called == name]


@pytest.fixture()
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def _frontend(gpus: int = 1, **options: Any) -> tuple[TinkerFrontend, RecordingServer]:
    server = RecordingServer()
    server.num_gpus = gpus
    return TinkerFrontend(server, **options), server  # type: ignore[arg-type]


def _wait(future, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while future.outcome is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert future.outcome is not None and future.outcome.error is None, future.outcome
    return future.outcome


def test_tinkers_switches_map_to_module_suffixes_and_the_seed_is_kept():
    lora = lora_section({"rank": 8, "seed": 5, "train_mlp": False, "train_unembed": True})
    assert lora["rank"] == 8 and lora["seed"] == 5 and lora["dropout"] == 0.0
    assert lora["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]
    default = lora_section(None)
    assert default["rank"] == 32 and len(default["target_modules"]) == 8


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"rank": 1024}, "above 512"),
        ({"rank": 0}, "positive integer"),
        ({"rank": 8, "train_mlp": False, "train_attn": False, "train_unembed": False}, "nothing"),
    ],
)
def test_a_lora_config_no_sampler_could_serve_is_refused(config, words):
    with pytest.raises(InvalidRequestError, match=words):
        lora_section(config)


def test_a_base_model_no_job_could_load_is_refused(tmp_path, monkeypatch, model_dir):
    check_base_model(model_dir)
    with pytest.raises(InvalidRequestError, match="no such file"):
        check_base_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequestError, match="without config"):
        check_base_model(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(InvalidRequestError, match="Hugging Face cache"):
        check_base_model("some-org/some-model")


def test_a_lora_model_starts_lora_jobs_and_syncs_and_serves_adapter_versions(model_dir):
    frontend, server = _frontend()
    try:
        session = frontend.create_session()
        _wait(frontend.create_model(session, 0, model_dir, {"rank": 8, "seed": 3}))
        configs = [p["config"] for p in server.sent("initialize")]
        assert [p["job_type"] for p in server.sent("initialize")] == ["training", "sampling"]
        for config in configs:  # the same LoRA config reaches both jobs
            assert config["training_config"]["lora"]["rank"] == 8
            assert config["training_config"]["lora"]["seed"] == 3
        model_id = f"{session}:train:0"
        info = frontend.get_info(model_id)
        assert info["is_lora"] is True and info["lora_rank"] == 8
        adapter = frontend.model(model_id).adapter
        (added,) = server.sent("add_adapter")
        assert added == {"job_id": 1, "adapter": adapter, "seed": 3}
        first = _wait(frontend.save_weights_for_sampler(model_id, 1, None)).json
        _wait(frontend.save_weights_for_sampler(model_id, 2, "later"))
        synced = server.sent("sync_weights")
        assert [(p["adapter"], p["training_adapter"]) for p in synced] == [(adapter, adapter)] * 2
        assert first["path"].endswith("/sampler_weights/v1")
        sampler = frontend.sampler(first["sampling_session_id"])
        frontend.sample(sampler, {"prompt": {"chunks": [{"tokens": [1, 2]}]}, "num_samples": 1})
        deadline = time.monotonic() + 5
        while not server.sent("generate") and time.monotonic() < deadline:
            time.sleep(0.01)
        (generate,) = server.sent("generate")  # version 1 after version 2 exists: no 409
        assert generate["adapter"] == adapter and generate["adapter_version"] == 1
        base = frontend.sampler(frontend.create_sampling_session(session, None, model_dir))
        assert (base.job_id, base.adapter) == (sampler.job_id, "base")
        assert len(server.sent("initialize")) == 2  # no job of its own
    finally:
        frontend.close()


def test_full_fine_tuning_only_when_the_server_says_so(model_dir):
    frontend, server = _frontend(full_fine_tuning=True)
    try:
        session = frontend.create_session()
        _wait(frontend.create_model(session, 0, model_dir, {"rank": 8}))
        assert all(p["config"].get("training_config") is None for p in server.sent("initialize"))
        info = frontend.get_info(f"{session}:train:0")
        assert info["is_lora"] is False and info["lora_rank"] is None
        _wait(frontend.save_weights_for_sampler(f"{session}:train:0", 1, "x"))
        assert "adapter" not in server.sent("sync_weights")[0]
    finally:
        frontend.close()


def test_bad_lora_settings_are_refused_before_any_job_starts(model_dir, tmp_path):
    frontend, server = _frontend()
    try:
        session = frontend.create_session()
        with pytest.raises(InvalidRequestError, match="512"):
            frontend.create_model(session, 0, model_dir, {"rank": 600})
        with pytest.raises(InvalidRequestError, match="no such file"):
            frontend.create_model(session, 1, str(tmp_path / "nope"), {"rank": 8})
        assert server.sent("initialize") == [] and frontend.models == {}
    finally:
        frontend.close()


def test_training_calls_name_the_models_adapter_and_load_state_asks_for_a_fresh_optimizer(
    model_dir,
):
    frontend, server = _frontend()
    try:
        session = frontend.create_session()
        _wait(frontend.create_model(session, 0, model_dir, {"rank": 8}))
        model_id = f"{session}:train:0"
        adapter = frontend.model(model_id).adapter
        _wait(frontend.optim_step(model_id, 1, {"learning_rate": 1e-3}))
        path = _wait(frontend.save_weights(model_id, 2, "a")).json["path"]
        _wait(frontend.load_weights(model_id, 3, path, optimizer=True))
        _wait(frontend.load_weights(model_id, 4, path, optimizer=False))
        (step,) = server.sent("step")
        (saved,) = server.sent("save_checkpoint")
        assert step["adapter"] == adapter and saved["adapter"] == adapter
        assert saved["tag"] == f"{adapter}-a"  # the pool's models share one checkpoint root
        with_optimizer, weights_only = server.sent("load_checkpoint")
        assert "optimizer" not in with_optimizer and with_optimizer["path"] == f"/ckpt/{adapter}-a"
        assert weights_only["optimizer"] is False and weights_only["adapter"] == adapter
    finally:
        frontend.close()


def test_models_of_one_base_and_shape_share_one_pool_until_the_last_one_goes(model_dir):
    frontend, server = _frontend(gpus=2)  # a GPU a pool: two shapes side by side
    try:
        sessions = [frontend.create_session() for _ in range(3)]
        for session in sessions:
            _wait(frontend.create_model(session, 0, model_dir, {"rank": 8}))
        models = [frontend.model(f"{s}:train:0") for s in sessions]
        assert len(server.sent("initialize")) == 2  # one training and one sampling job
        assert len({(m.training_job, m.sampling_job) for m in models}) == 1
        assert len({m.adapter for m in models}) == 3
        _wait(frontend.create_model(sessions[0], 1, model_dir, {"rank": 16}))
        assert len(server.sent("initialize")) == 4  # another shape: a pool of its own
        groups = [p.get("colocation_group") for p in server.sent("initialize")]
        assert groups == ["tinker-gpu-0"] * 2 + ["tinker-gpu-1"] * 2  # on a GPU each
        with pytest.raises(NoGpuRoomError, match="rank 32"):  # a third shape: no GPU left
            frontend.create_model(sessions[0], 2, model_dir, {"rank": 32})
        assert len(server.sent("initialize")) == 4 and f"{sessions[0]}:train:2" not in (
            frontend.models
        )
        frontend.finish_session(sessions[1])
        removed = server.sent("remove_adapter")
        assert {(p["job_id"], p["adapter"]) for p in removed} == {
            (models[1].training_job, models[1].adapter),
            (models[1].sampling_job, models[1].adapter),
        }
        assert server.sent("destroy") == []  # the pool goes on for the other two
        frontend.finish_session(sessions[0])  # the rank-16 pool's last model: its jobs go
        assert sorted(p["job_id"] for p in server.sent("destroy")) == [3, 4]
        frontend.finish_session(sessions[2])
        assert sorted(p["job_id"] for p in server.sent("destroy")) == [1, 2, 3, 4]
        _wait(frontend.create_model(frontend.create_session(), 0, model_dir, {"rank": 8}))
        assert len(server.sent("initialize")) == 6  # the old pool is gone: a new one starts
    finally:
        frontend.close()


class FailingServer(RecordingServer):
    """A server whose training jobs never start."""

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        if name == "get_job":
            return {"state": "failed", "reason": "no bundle"}
        return super().handle(name, payload)


def test_a_pool_whose_jobs_fail_fails_its_models_and_the_next_model_starts_a_new_one(model_dir):
    server = FailingServer()
    frontend = TinkerFrontend(server)  # type: ignore[arg-type]
    try:
        session = frontend.create_session()
        future = frontend.create_model(session, 0, model_dir, {"rank": 8})
        deadline = time.monotonic() + 10
        while future.outcome is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert future.outcome is not None and "no bundle" in str(future.outcome.error)
        assert sorted(p["job_id"] for p in server.sent("destroy")) == [1, 2]
        assert frontend.pools.by_key == {}
        frontend.create_model(session, 1, model_dir, {"rank": 8})
        deadline = time.monotonic() + 10
        while len(server.sent("initialize")) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(server.sent("initialize")) == 4
    finally:
        frontend.close()


def test_a_base_sampler_moves_to_another_pool_of_its_base_when_its_pool_goes(model_dir):
    frontend, _ = _frontend(gpus=2)  # two shapes: a GPU each
    try:
        first, second = frontend.create_session(), frontend.create_session()
        _wait(frontend.create_model(first, 0, model_dir, {"rank": 8}))
        base_id = frontend.create_sampling_session(second, None, model_dir)
        job = frontend.sampler(base_id).job_id
        _wait(frontend.create_model(second, 0, model_dir, {"rank": 16}))  # another pool
        frontend.finish_session(first)
        moved = frontend.sampler(base_id)
        assert moved.job_id != job and moved.adapter == "base"
        assert moved.job_id == frontend.model(f"{second}:train:0").sampling_job
        frontend.finish_session(second)  # no pool of that base is left: it goes
        with pytest.raises(InvalidRequestError, match="unknown sampling_session_id"):
            frontend.sampler(base_id)
    finally:
        frontend.close()


def _safetensors(path, names):
    import json
    import struct

    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]} for n in names}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)


def test_target_modules_a_local_model_lacks_are_refused_naming_those_it_has(model_dir, tmp_path):
    from arctic_rl_tinker.lora_models import check_targets

    attention = [f"model.layers.0.self_attn.{m}.weight" for m in ("q_proj", "k_proj")]
    _safetensors(tmp_path / "model.safetensors", [*attention, "model.embed_tokens.weight"])
    check_targets(model_dir, ["q_proj", "k_proj"])
    with pytest.raises(InvalidRequestError, match=r"\['lm_head'\].*embed_tokens"):
        check_targets(model_dir, ["q_proj", "lm_head"])
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')
    check_targets(model_dir, ["q_proj", "lm_head"])  # tied: the lm_head module exists
    frontend, server = _frontend()
    try:
        session = frontend.create_session()
        with pytest.raises(InvalidRequestError, match="gate_proj"):
            frontend.create_model(session, 0, model_dir, {"rank": 8})
        assert server.sent("initialize") == []
    finally:
        frontend.close()
