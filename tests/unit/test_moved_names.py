"""Names that moved to a new home keep importing from their old one (one release), as the
very same objects: deprecated shims and re-exports of the core layout."""

from __future__ import annotations

import importlib

import pytest

RL = "arctic_platform.rl"
MOVED = [
    # (old module, name, new module), below arctic_platform.rl
    ("protocol", "encode_frame", "wire.frames"),
    ("protocol", "decode_frame", "wire.frames"),
    ("protocol", "validate_batch", "wire.frames"),
    ("protocol", "FRAME_CONTENT_TYPE", "wire.frames"),
    ("protocol", "MAX_NESTING", "wire.frames"),
    ("protocol", "FrameError", "wire.frames"),
    ("protocol", "BatchError", "batch"),
    ("protocol", "BATCH_FIELDS", "batch"),
    ("protocol", "PER_TOKEN_FIELDS", "batch"),
    ("operations", "OPERATIONS", "wire.operations"),
    ("operations", "BY_NAME", "wire.operations"),
    ("operations", "Operation", "wire.operations"),
    ("wire", "FwdBwdRequest", "wire.requests"),
    ("wire", "describe_errors", "wire.requests"),
    ("wire", "JOB_TYPES", "wire.requests"),
    ("wire", "CHECKPOINT_TAG_PATTERN", "wire.requests"),
    ("server.jobs", "Job", "server.job_state"),
    ("server.jobs", "JobState", "server.job_state"),
    ("server.jobs", "free_port", "network"),
    ("testing", "free_port", "network"),
    ("server", "Job", "server.job_state"),
    ("server.job_table", "RequestIdRecord", "server.ledger"),
    ("server.job_table", "remember_request", "server.ledger"),
    ("server.job_table", "replay_request", "server.ledger"),
    ("server.job_table", "roll_back_requests", "server.ledger"),
    ("server.job_table", "ledger_entry", "server.ledger"),
    ("server.job_table", "REQUEST_IDS_KEPT", "server.ledger"),
    ("server.job_table", "RolledBackError", "errors"),
    ("weight_sync.coordinator", "llama_tp_shard", "weight_sync.sharding"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_a_moved_name_imports_from_its_old_home_as_the_same_object(old, name, new):
    moved = getattr(importlib.import_module(f"{RL}.{new}"), name)
    assert getattr(importlib.import_module(f"{RL}.{old}"), name) is moved


@pytest.mark.parametrize("shim", ["protocol", "operations"])
def test_a_shim_module_says_it_is_deprecated(shim):
    assert "Deprecated" in (importlib.import_module(f"{RL}.{shim}").__doc__ or "")
