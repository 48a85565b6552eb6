"""LoRA in the server's weight sync and inference answers, without Ray: mode checks before
anything moves, versions per (job, adapter), what generate reports, the request fields."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arctic_platform.rl import wire
from arctic_platform.rl.errors import InvalidRequestError
from arctic_platform.rl.server.job_state import Job, JobState
from arctic_platform.rl.server.job_table import JobRecord
from arctic_platform.rl.server.jobs import JobManager
from arctic_platform.rl.server.weight_sync_ops import WeightSyncOps, served_weights

LORA = {"training_config": {"lora": {"rank": 8}}}


class _Untouchable:
    """A worker handle that fails the test when anything is asked of it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"worker.{name} was used: something moved before the check")


def _job(job_id: int, job_type: str, config: dict[str, Any]) -> Job:
    job = Job(job_id, job_type, "vllm" if job_type != "training" else "deepspeed", config, 1)
    job.state = JobState.RUNNING
    job.workers = [_Untouchable()]
    return job


def _ops(tmp_path: Path, *jobs: Job) -> WeightSyncOps:
    manager = JobManager(tmp_path)
    for job in jobs:
        manager.jobs[job.job_id] = job
    return WeightSyncOps(manager, timeout=5.0, bucket_bytes=1 << 20)


def _sync(**fields: Any) -> wire.SyncWeightsRequest:
    return wire.SyncWeightsRequest(training_job_id=1, sampling_job_ids=[2], **fields)


@pytest.mark.parametrize(
    ("trainer", "sampler", "says"),
    [
        (LORA, {}, "trains a LoRA adapter (rank 8) but sampling job 2 serves full weights"),
        ({}, LORA, "trains full weights but sampling job 2 serves a LoRA adapter (rank 8)"),
    ],
)
def test_a_sync_between_a_lora_and_a_full_job_is_refused_naming_both_before_anything_moves(
    tmp_path, trainer, sampler, says
):
    ops = _ops(tmp_path, _job(1, "training", trainer), _job(2, "sampling", sampler))
    with pytest.raises(InvalidRequestError, match=re.escape("training job 1 " + says)):
        ops.sync(_sync())


def test_an_adapter_sync_from_a_full_weight_trainer_is_refused(tmp_path):
    ops = _ops(tmp_path, _job(1, "training", {}), _job(2, "sampling", {}))
    with pytest.raises(InvalidRequestError, match="trains full weights, so there is no adapter"):
        ops.sync(_sync(adapter="mine"))


def test_the_base_adapter_name_cannot_be_synced_into(tmp_path):
    ops = _ops(tmp_path, _job(1, "training", LORA), _job(2, "sampling", LORA))
    with pytest.raises(InvalidRequestError, match="'base' names the base model"):
        ops.sync(_sync(adapter="base"))


def test_an_adapter_above_the_samplers_rank_is_refused(tmp_path):
    sampler = {"training_config": {"lora": {"rank": 8}}, "vllm_config": {"max_lora_rank": 1}}
    ops = _ops(tmp_path, _job(1, "training", LORA), _job(2, "sampling", sampler))
    with pytest.raises(InvalidRequestError, match="rank 8, above the largest rank sampling job 2"):
        ops.sync(_sync())


def test_a_lora_target_whose_engine_cannot_load_adapters_is_refused(tmp_path, monkeypatch):
    sampler = _job(2, "sampling", LORA)
    ops = _ops(tmp_path, _job(1, "training", LORA), sampler)

    class Worker:
        class accepts_adapters:  # stands for a Ray actor method
            @staticmethod
            def remote() -> bool:
                return False

    sampler.workers = [Worker()]
    monkeypatch.setattr(ops.jobs, "call", lambda job, refs, what, timeout=None: list(refs))
    with pytest.raises(InvalidRequestError, match="engine 'vllm', which cannot load LoRA"):
        ops.sync(_sync())


def test_generate_reports_the_adapter_and_version_it_serves():
    job = _job(2, "sampling", LORA)
    assert served_weights(job, None, None) == {"weight_version": 0, "adapter": "base"}
    job.adapter_versions = {"default": 3, "other": 5}
    job.weight_version = 3
    assert served_weights(job, None, None) == {"weight_version": 3, "adapter": "default"}
    assert served_weights(job, "other", None) == {"weight_version": 5, "adapter": "other"}
    assert served_weights(job, "other", 2) == {"weight_version": 2, "adapter": "other"}
    assert served_weights(job, "base", None) == {"weight_version": 0, "adapter": "base"}
    with pytest.raises(InvalidRequestError, match="has no versions"):
        served_weights(job, "base", 1)


def test_a_full_weight_job_refuses_an_adapter_and_reports_its_version():
    job = _job(2, "sampling", {})
    job.weight_version = 4
    assert served_weights(job, None, None) == {"weight_version": 4}
    with pytest.raises(InvalidRequestError, match="sampling job 2 is not in LoRA mode"):
        served_weights(job, "default", None)
    with pytest.raises(InvalidRequestError, match="not in LoRA mode"):
        served_weights(job, None, 1)


def test_the_default_adapters_version_never_falls_behind_the_jobs_weight_version():
    job = _job(2, "sampling", LORA)
    job.adapter_versions = {"default": 2, "other": 7}
    job.weight_version = 5  # a restart moved it on
    assert job.adapter_version("default") == 5
    assert job.adapter_version("other") == 7
    assert job.adapter_version("new") == 0


def test_adapter_versions_survive_the_job_table():
    job = _job(2, "sampling", LORA)
    job.adapter_versions = {"default": 2, "t1": 4}
    job.synced_from, job.synced_adapter = 1, "t1"
    record = JobRecord.model_validate_json(job.record().model_dump_json())
    back = Job.from_record(record)
    assert back.adapter_versions == {"default": 2, "t1": 4} and back.synced_adapter == "t1"
    back.adapter_versions["t1"] = 9
    assert job.adapter_versions["t1"] == 4  # the record holds its own copy


def test_requests_take_an_adapter_and_a_version_and_pass_only_those_set():
    request = wire.GenerateRequest(job_id=2, prompts=["x"], adapter="t1", adapter_version=3)
    assert request.adapter_kwargs() == {"adapter": "t1", "adapter_version": 3}
    assert wire.LogProbsRequest(job_id=2, prompts=[[1]], completions=[[2]]).adapter_kwargs() == {}
    assert wire.SyncWeightsRequest(training_job_id=1, adapter="t1").adapter == "t1"
    for bad in ({"adapter": "a/b"}, {"adapter": ""}, {"adapter": "../x"}, {"adapter_version": -1}):
        with pytest.raises(ValidationError):
            wire.GenerateRequest(job_id=2, prompts=["x"], **bad)


class _Method:
    """A Ray actor method stand-in: ``.remote(...)`` returns ``(name, args, kwargs)``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def remote(self, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return (self.name, args, kwargs)


class _Worker:
    def __getattr__(self, name: str) -> _Method:
        return _Method(name)


def _answering(ops: WeightSyncOps, receive: Any, calls: list[Any]) -> None:
    """Make ``ops.jobs.call`` answer the fake workers' refs; ``receive(kwargs)`` answers a
    ``sync_receive`` (or raises)."""

    def call(job: Job, refs: list[Any], what: str, timeout: float | None = None) -> list[Any]:
        out = []
        for name, _, kwargs in refs:
            calls.append((name, kwargs))
            if name == "free_port_range":
                out.append(40000)
            elif name == "accepts_adapters":
                out.append(True)
            elif name == "sync_send":
                out.append({"bytes": 160})
            else:
                out.append(receive(kwargs))
        return out

    ops.jobs.call = call  # type: ignore[method-assign]


def _lora_pair(tmp_path: Path) -> tuple[WeightSyncOps, Job, Job]:
    trainer, sampler = _job(1, "training", LORA), _job(2, "sampling", LORA)
    trainer.workers, sampler.workers = [_Worker()], [_Worker()]
    return _ops(tmp_path, trainer, sampler), trainer, sampler


def test_an_adapter_sync_counts_versions_per_adapter_and_answers_tensor_bytes(tmp_path):
    ops, _, sampler = _lora_pair(tmp_path)
    calls: list[Any] = []
    _answering(ops, lambda kw: {"bytes": 192, "tensor_bytes": 150, "swap": {}}, calls)
    first = ops.sync(_sync())
    assert (first["adapter"], first["weight_version"], first["strategy"]) == (
        "default",
        1,
        "adapter",
    )
    assert first["bytes"] == 150 and first["wire_bytes"] == 192
    receive = next(kw for name, kw in calls if name == "sync_receive")
    assert receive["adapter"] == "default"
    assert receive["lora"]["rank"] == 8 and "lm_head" in receive["lora"]["target_modules"]
    other = ops.sync(_sync(adapter="t2"))
    assert other["weight_version"] == 1 and ops.sync(_sync())["weight_version"] == 2
    assert sampler.adapter_versions == {"default": 2, "t2": 1} and sampler.weight_version == 2


def test_an_engine_refusal_in_the_receive_is_its_own_4xx_and_the_pair_worlds_are_forgotten(
    tmp_path,
):
    ops, trainer, sampler = _lora_pair(tmp_path)

    def refuse(kwargs: dict[str, Any]) -> Any:
        raise InvalidRequestError("vLLM refused adapter 'default' version 1")

    _answering(ops, refuse, [])
    with pytest.raises(InvalidRequestError, match="vLLM refused adapter"):
        ops.sync(_sync())
    assert trainer.job_id not in ops._kept  # the next sync builds new pair worlds
    assert sampler.adapter_versions == {} and sampler.weight_version == 0
    assert not trainer.lock._is_owned() and not sampler.lock._is_owned()  # type: ignore[attr-defined]


def test_a_named_training_adapter_is_sent_and_loaded_under_its_own_name(tmp_path):
    ops, _, sampler = _lora_pair(tmp_path)
    calls: list[Any] = []
    _answering(ops, lambda kw: {"bytes": 192, "tensor_bytes": 150, "swap": {}}, calls)
    synced = ops.sync(_sync(training_adapter="model-2"))
    assert synced["adapter"] == "model-2" and synced["weight_version"] == 1
    send = next(kw for name, kw in calls if name == "sync_send")
    receive = next(kw for name, kw in calls if name == "sync_receive")
    assert send["adapter"] == "model-2" and receive["adapter"] == "model-2"
    calls.clear()
    ops.sync(_sync())  # no name: the trainer sends the adapter it worked on last
    assert "adapter" not in next(kw for name, kw in calls if name == "sync_send")
    assert sampler.adapter_versions == {"model-2": 1, "default": 1}


def test_training_requests_name_an_adapter_and_a_weights_only_load():
    fields = {"job_id": 1, "adapter": "m1"}
    assert wire.StepRequest(**fields).adapter_kwargs() == {"adapter": "m1"}
    assert wire.StepRequest(job_id=1).adapter_kwargs() == {}
    load = wire.LoadCheckpointRequest(**fields, optimizer=False)
    assert load.optimizer is False and wire.LoadCheckpointRequest(job_id=1).optimizer
    assert wire.AddAdapterRequest(**fields, seed=4).seed == 4
    for bad in ({"adapter": "a/b"}, {"adapter": ""}, {}):
        with pytest.raises(ValidationError):
            wire.AddAdapterRequest(job_id=1, **bad)
        with pytest.raises(ValidationError):
            wire.RemoveAdapterRequest(job_id=1, **bad)
    with pytest.raises(ValidationError):
        wire.SaveCheckpointRequest(job_id=1, adapter="../x")
