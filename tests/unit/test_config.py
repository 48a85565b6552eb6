"""ArcticRLClientConfig and WeightSyncConfig follow the configuration reference exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arctic_platform.rl.config import (
    JOB_ID_FIELDS,
    ArcticRLClientConfig,
    TrainingConfig,
    WeightSyncConfig,
)
from arctic_platform.rl.network import primary_ipv4

# the configuration reference we implement field for field (a copy of the project's seed text)
REFERENCE = Path(__file__).resolve().parent / "data" / "config-reference.txt"
REQUIRED = object()

# name -> (type as the reference writes it, default). Changing a default breaks this table.
CLIENT_FIELDS: dict[str, tuple[str, Any]] = {
    "backend": ('"local" | "dss-platform"', "local"),
    "comm_protocol": ('"http" | "ray"', "http"),
    "host": ("Optional[str]", None),
    "port": ("Optional[int]", None),
    "model_name": ("str", REQUIRED),
    "checkpoint_path": ("Optional[str]", None),
    "ds_config": ("dict", {}),
    "training_config": ("Optional[dict]", None),
    "vllm_config": ("Optional[dict]", None),
    "log_prob_ds_config": ("Optional[dict]", None),
    "ds_worker_config": ("Optional[dict]", None),
    "arctic_inference_config": ("Optional[dict]", None),
    "training_gpus": ("int", 0),
    "sampling_gpus": ("int", 0),
    "log_prob_gpus": ("int", 0),
    "log_prob_engine": ('"vllm" | "deepspeed"', "vllm"),
    "colocate": ("bool", False),
    "full_determinism": ("bool", False),
    "seed": ("int", 42),
    "ray_auto_attach": ("bool", True),
    "server_logs": ("bool", True),
    "startup_timeout": ("float", 300.0),
    "health_check_interval": ("float", 2.0),
    "job_ready_timeout": ("float", 600.0),
    "training_job_id": ("Optional[int]", None),
    "sampling_job_id": ("Optional[int]", None),
    "log_prob_job_id": ("Optional[int]", None),
}
# Fields we add beyond the reference (DESIGN.md §3: the engines of the other two roles).
EXTENSION_FIELDS = {"training_engine": "deepspeed", "sampling_engine": "vllm"}

WEIGHT_SYNC_FIELDS: dict[str, tuple[str, Any]] = {
    "training_sharding": ("str", "dp"),
    "training_gpus": ("int", 1),
    "inference_replicas": ("int", 1),
    "inference_tp": ("int", 1),
    "base_port": ("int", 29500),
    "bucket_size": ("int", 268435456),
}


def _reference_rows() -> dict[str, tuple[str, str, str]]:
    """Rows ``name -> (type, default, description)`` parsed from the reference text."""
    rows = {}
    for line in REFERENCE.read_text().splitlines():
        cells = line.split("\t")
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    return rows


def test_client_config_has_exactly_the_reference_fields_plus_documented_extensions():
    assert set(ArcticRLClientConfig.model_fields) == set(CLIENT_FIELDS) | set(EXTENSION_FIELDS)


@pytest.mark.parametrize("name", sorted(CLIENT_FIELDS))
def test_client_config_default_matches_reference(name):
    field = ArcticRLClientConfig.model_fields[name]
    expected = CLIENT_FIELDS[name][1]
    if expected is REQUIRED:
        assert field.is_required()
    else:
        assert field.get_default(call_default_factory=True) == expected


@pytest.mark.parametrize("name", sorted(WEIGHT_SYNC_FIELDS))
def test_weight_sync_default_matches_reference(name):
    assert WeightSyncConfig.model_fields[name].default == WEIGHT_SYNC_FIELDS[name][1]
    assert set(WeightSyncConfig.model_fields) == set(WEIGHT_SYNC_FIELDS)


def test_extension_defaults():
    for name, default in EXTENSION_FIELDS.items():
        assert ArcticRLClientConfig.model_fields[name].default == default


def test_fields_types_defaults_and_descriptions_agree_with_the_reference_text():
    rows = _reference_rows()
    both = {**CLIENT_FIELDS, **WEIGHT_SYNC_FIELDS}
    assert set(rows) == set(both)
    for name, (ref_type, ref_default, ref_desc) in rows.items():
        model = ArcticRLClientConfig if name in CLIENT_FIELDS else WeightSyncConfig
        if name == "training_gpus" and "DeepSpeed" not in ref_desc:
            model = WeightSyncConfig
        field = model.model_fields[name]
        assert field.description == ref_desc, name
        table = CLIENT_FIELDS if model is ArcticRLClientConfig else WEIGHT_SYNC_FIELDS
        assert ref_type.replace("\\|", "|").replace("`", "") == table[name][0], name
        default = re.sub(r"\s*\(.*\)$", "", ref_default).strip("`")
        if table[name][1] is REQUIRED:
            assert default == "(required)" or ref_default == "(required)"
        else:
            assert default == repr(table[name][1]).replace("'", '"') or str(
                table[name][1]
            ) == default.strip('"'), name


def test_weight_sync_training_gpus_description_is_the_reference_one():
    assert WeightSyncConfig.model_fields["training_gpus"].description == "Number of training GPUs."


# --- the reference's three examples -------------------------------------------------------


def test_seed_basic_example_constructs():
    config = ArcticRLClientConfig(
        model_name="meta-llama/Llama-2-7b", training_gpus=4, sampling_gpus=2
    )
    assert config.training_gpus == 4 and config.sampling_gpus == 2
    assert config.host == primary_ipv4() and config.port == 7000


def test_seed_advanced_example_constructs():
    config = ArcticRLClientConfig(
        model_name="meta-llama/Llama-2-7b",
        backend="local",
        comm_protocol="http",
        training_gpus=4,
        sampling_gpus=2,
        log_prob_gpus=1,
        full_determinism=True,
        seed=123,
        training_config={
            "optimizer": {"lr": 1e-5, "weight_decay": 0.01, "lr_scheduler_type": "cosine"},
            "dtype": "bfloat16",
            "gradient_checkpointing": True,
        },
        startup_timeout=600.0,
        job_ready_timeout=900.0,
    )
    assert config.training_config is not None
    assert config.training_config.optimizer.lr_scheduler_type == "cosine"
    assert config.training_config.dtype == "bfloat16"
    assert config.seed == 123 and config.job_ready_timeout == 900.0


def test_seed_reconnect_example_constructs_without_gpus():
    config = ArcticRLClientConfig(
        model_name="meta-llama/Llama-2-7b",
        training_job_id=42,
        sampling_job_id=43,
        log_prob_job_id=44,
        host="192.168.1.100",
        port=7000,
    )
    assert config.reconnect_mode
    assert (config.host, config.port) == ("192.168.1.100", 7000)


# --- validation rules ---------------------------------------------------------------------


def _fields_in_error(exc: ValidationError) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in exc.errors()}


def test_local_backend_with_some_gpus_is_valid():
    assert ArcticRLClientConfig(model_name="m", log_prob_gpus=1).log_prob_gpus == 1


def test_local_backend_without_gpus_is_an_error_saying_so():
    with pytest.raises(ValidationError, match="at least one of training_gpus"):
        ArcticRLClientConfig(model_name="m")


def test_remote_backend_needs_no_gpu_counts():
    assert ArcticRLClientConfig(model_name="m", backend="dss-platform").backend == "dss-platform"


@pytest.mark.parametrize("field", ["training_gpus", "sampling_gpus", "log_prob_gpus"])
def test_negative_gpu_count_names_the_field(field):
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", **{"sampling_gpus": 1, field: -1})
    assert field in _fields_in_error(info.value)


@pytest.mark.parametrize("field", ["startup_timeout", "health_check_interval", "job_ready_timeout"])
@pytest.mark.parametrize("value", [0, -1.5])
def test_non_positive_timeouts_are_rejected(field, value):
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", training_gpus=1, **{field: value})
    assert field in _fields_in_error(info.value)


def test_positive_timeouts_are_accepted():
    timeouts = {"startup_timeout": 0.5, "health_check_interval": 0.1, "job_ready_timeout": 1}
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, **timeouts)
    assert (c.startup_timeout, c.health_check_interval, c.job_ready_timeout) == (0.5, 0.1, 1.0)


def test_http_derives_primary_ip_and_port_7000():
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, comm_protocol="http")
    assert (c.host, c.port) == (primary_ipv4(), 7000)


def test_explicit_host_and_port_are_kept():
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, host="127.0.0.1", port=7123)
    assert (c.host, c.port) == ("127.0.0.1", 7123)


def test_ray_leaves_host_and_port_none():
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, comm_protocol="ray")
    assert (c.host, c.port) == (None, None)


@pytest.mark.parametrize("port", [0, 65536, -3])
def test_port_out_of_range_is_rejected(port):
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", training_gpus=1, port=port)
    assert "port" in _fields_in_error(info.value)


def test_misspelled_backend_suggests_the_installed_one():
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", training_gpus=1, backend="dss-platfrom")
    message = str(info.value)
    assert "Did you mean 'dss-platform'?" in message
    assert "Installed: dss-platform, local" in message
    assert "backend" in _fields_in_error(info.value)


def test_unknown_transport_lists_installed():
    with pytest.raises(ValidationError, match=r"Installed: http, ray"):
        ArcticRLClientConfig(model_name="m", training_gpus=1, comm_protocol="grpc")


def test_unknown_log_prob_engine_lists_log_prob_engines():
    with pytest.raises(
        ValidationError, match=r"Unknown log_prob engine 'vlm'.*Installed: deepspeed, vllm.*'vllm'"
    ):
        ArcticRLClientConfig(model_name="m", training_gpus=1, log_prob_engine="vlm")


def test_log_prob_engine_deepspeed_is_accepted():
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, log_prob_engine="DeepSpeed")
    assert c.log_prob_engine == "deepspeed"


def test_misspelled_field_is_rejected_by_name():
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", training_gpu=1)
    assert "training_gpu" in _fields_in_error(info.value)


def test_model_name_is_required():
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(training_gpus=1)
    assert "model_name" in _fields_in_error(info.value)


# --- training_config ----------------------------------------------------------------------


def test_training_config_standard_fields_are_typed():
    tc = TrainingConfig.model_validate(
        {
            "optimizer": {
                "lr": 3e-4,
                "weight_decay": 0.1,
                "beta1": 0.8,
                "beta2": 0.95,
                "eps": 1e-6,
                "lr_scheduler_type": "linear",
                "gradient_clipping": 0.5,
                "warmup_ratio": 0.1,
            },
            "dtype": "bf16",
            "gradient_checkpointing": True,
            "attn_impl": "sdpa",
            "mb_spec": {"max_tokens_per_mb": 4096},
        }
    )
    assert tc.optimizer.lr == 3e-4 and tc.optimizer.warmup_fraction == 0.1
    assert tc.dtype == "bfloat16" and tc.mb_spec.max_tokens_per_mb == 4096


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"optimizer": {"lr": "fast"}}, "training_config.optimizer.lr"),
        ({"optimizer": {"lr": -1}}, "training_config.optimizer.lr"),
        (
            {"optimizer": {"lr_scheduler_type": "step"}},
            "training_config.optimizer.lr_scheduler_type",
        ),
        (
            {"optimizer": {"warmup_steps_proportion": 1.5}},
            "training_config.optimizer.warmup_steps_proportion",
        ),
        ({"dtype": "int8"}, "training_config.dtype"),
        ({"gradient_checkpointing": "maybe"}, "training_config.gradient_checkpointing"),
        ({"mb_spec": {"max_tokens_per_mb": 0}}, "training_config.mb_spec.max_tokens_per_mb"),
    ],
)
def test_training_config_wrong_types_name_the_nested_field(data, loc):
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", training_gpus=1, training_config=data)
    assert loc in _fields_in_error(info.value)


def test_training_config_warmup_aliases_must_agree():
    with pytest.raises(ValidationError, match="aliases"):
        TrainingConfig.model_validate(
            {"optimizer": {"warmup_ratio": 0.1, "warmup_steps_proportion": 0.2}}
        )


def test_training_config_keeps_unknown_extra_fields():
    c = ArcticRLClientConfig(
        model_name="m",
        training_gpus=1,
        training_config={"my_flag": 3, "optimizer": {"custom": "x"}},
    )
    assert c.training_config is not None
    assert c.training_config.extra_fields == {"my_flag": 3}
    dumped = c.initialize_payload()["training_config"]
    assert dumped["my_flag"] == 3 and dumped["optimizer"]["custom"] == "x"


# --- payload and reconnect ----------------------------------------------------------------


def test_job_ids_are_not_sent_to_initialize():
    c = ArcticRLClientConfig(
        model_name="m", training_gpus=1, training_job_id=1, sampling_job_id=2, log_prob_job_id=3
    )
    payload = c.initialize_payload()
    assert not set(payload) & JOB_ID_FIELDS
    assert payload["model_name"] == "m" and payload["training_gpus"] == 1


def test_for_reconnect_fills_job_ids_host_and_port_and_keeps_the_rest():
    c = ArcticRLClientConfig(model_name="m", training_gpus=2, sampling_gpus=1, seed=7)
    r = c.for_reconnect(
        training_job_id=5, sampling_job_id=6, log_prob_job_id=None, host="127.0.0.1", port=7555
    )
    assert (r.training_job_id, r.sampling_job_id, r.log_prob_job_id) == (5, 6, None)
    assert (r.host, r.port, r.seed, r.training_gpus) == ("127.0.0.1", 7555, 7, 2)
    assert r.reconnect_mode and not c.reconnect_mode
    assert c.training_job_id is None  # the original is unchanged


def test_for_reconnect_rejects_negative_job_ids():
    c = ArcticRLClientConfig(model_name="m", training_gpus=1)
    with pytest.raises(ValidationError):
        c.for_reconnect(training_job_id=-1)


# --- WeightSyncConfig ---------------------------------------------------------------------


def test_weight_sync_accepts_fsdp():
    assert WeightSyncConfig(training_sharding="fsdp").training_sharding == "fsdp"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"training_sharding": "tp"}, "training_sharding"),
        ({"training_gpus": 0}, "training_gpus"),
        ({"inference_replicas": 0}, "inference_replicas"),
        ({"inference_tp": 0}, "inference_tp"),
        ({"bucket_size": 0}, "bucket_size"),
        ({"base_port": 70000}, "base_port"),
        ({"base_port": 0}, "base_port"),
    ],
)
def test_weight_sync_rejects_bad_values_by_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        WeightSyncConfig(**kwargs)
    assert field in _fields_in_error(info.value)


def test_weight_sync_rejects_ports_that_run_past_65535():
    with pytest.raises(ValidationError, match="past 65535"):
        WeightSyncConfig(base_port=65530, inference_replicas=4, inference_tp=2)


def test_any_single_job_id_is_reconnect_mode_without_gpus():
    for field in ("training_job_id", "sampling_job_id", "log_prob_job_id"):
        config = ArcticRLClientConfig(model_name="m", host="127.0.0.1", port=7000, **{field: 3})
        assert config.reconnect_mode, field


# --- exact edges (each kills a mutant the tests above let through) --------------------------


def test_an_unknown_plugin_name_says_which_config_field_holds_it():
    with pytest.raises(ValidationError) as info:
        ArcticRLClientConfig(model_name="m", host="127.0.0.1", training_gpus=1, backend="locall")
    assert "Unknown backend 'locall' (config field backend). Installed: " in str(info.value)


def test_the_initialize_payload_is_plain_json_even_for_a_tuple_in_an_extra_key():
    config = ArcticRLClientConfig(
        model_name="m",
        host="127.0.0.1",
        training_gpus=1,
        training_job_id=None,
        training_config={"optimizer": {"lr": 1e-3, "betas": (0.9, 0.95)}},
    )
    payload = config.initialize_payload()
    assert payload == json.loads(json.dumps(payload))
    assert payload["training_config"]["optimizer"]["betas"] == [0.9, 0.95]
    assert not {"training_job_id", "sampling_job_id", "log_prob_job_id"} & set(payload)


def test_lora_section_defaults_bounds_and_served_rank():
    from arctic_platform.rl.config import DEFAULT_LORA_TARGETS, LoraConfig

    lora = TrainingConfig.model_validate({"lora": {"rank": 8}}).lora
    assert lora is not None and lora.rank == 8 and lora.alpha == 32.0 and lora.dropout == 0.0
    assert lora.target_modules == list(DEFAULT_LORA_TARGETS)
    assert lora.served_rank == 8
    assert LoraConfig(rank=9).served_rank == 16 and LoraConfig(rank=512).served_rank == 512
    assert LoraConfig(target_modules=["q_proj", " q_proj", "v_proj"]).target_modules == [
        "q_proj",
        "v_proj",
    ]
    assert TrainingConfig().lora is None
    for bad in (
        {"rank": 0},
        {"rank": 513},
        {"alpha": 0},
        {"target_modules": []},
        {"target_modules": [""]},
        {"dropout": 1.0},
        {"ranks": 8},
    ):
        with pytest.raises(ValidationError) as info:
            TrainingConfig.model_validate({"lora": bad})
        assert "lora" in str(info.value)
