"""Tokens files, authentication, and the protocol's create-job validation."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from arctic_platform.rl.errors import AuthError
from arctic_rl_dss.models import CreateJobRequest, SubJobConfig
from arctic_rl_dss.users import TokensFileError, Users

A, B = "a" * 20, "b" * 20


def test_the_long_and_short_tokens_file_forms_load(tmp_path):
    long = tmp_path / "long.json"
    long.write_text(json.dumps({"users": [{"name": "alice", "token": A, "reserved_gpus": 2}]}))
    assert Users.load(long).users[0].reserved_gpus == 2
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"alice": A, "bob": B}))
    assert [u.name for u in Users.load(short).users] == ["alice", "bob"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"alice": "short"}, "at least"),
        ({"users": [{"name": "a", "token": A}, {"name": "b", "token": A}]}, "shares a token"),
        ({"users": [{"name": "a", "token": A}, {"name": "a", "token": B}]}, "appears twice"),
        ({"users": [{"name": "a b", "token": A}]}, "invalid name"),
        ({"users": [{"name": "a", "token": A, "admin": True}]}, "unknown field"),
        ({}, "names no user"),
        ([], "expected an object"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_the_reason(data, message):
    with pytest.raises(TokensFileError, match=message):
        Users.from_data(data)


def test_a_missing_tokens_file_is_named(tmp_path):
    with pytest.raises(TokensFileError, match="does not exist"):
        Users.load(tmp_path / "nope.json")


def test_authentication_maps_each_token_to_its_user_and_refuses_others():
    users = Users.from_data({"alice": A, "bob": B})
    assert users.authenticate(f"Bearer {A}").name == "alice"
    assert users.authenticate(f"bearer {B}", "PROGRAMMATIC_ACCESS_TOKEN").name == "bob"
    for header in (None, "", "Bearer", f"Basic {A}", "Bearer nope-nope-nope-nope"):
        with pytest.raises(AuthError):
            users.authenticate(header)
    with pytest.raises(AuthError, match="Token-Type"):
        users.authenticate(f"Bearer {A}", "OAUTH")


def test_a_sub_job_takes_the_config_of_its_type_with_gpus():
    SubJobConfig(job_type="training", model_name="m", training_config={"n_gpus": 1})
    SubJobConfig(job_type="log_probability", model_name="m", inference_config={"n_gpus": 2})
    with pytest.raises(ValidationError, match="needs training_config"):
        SubJobConfig(job_type="training", model_name="m", inference_config={"n_gpus": 1})
    with pytest.raises(ValidationError, match="n_gpus"):
        SubJobConfig(job_type="sampling", model_name="m", inference_config={"n_gpus": 0})
    with pytest.raises(ValidationError, match="not training_config"):
        SubJobConfig(
            job_type="sampling",
            model_name="m",
            inference_config={"n_gpus": 1},
            training_config={"n_gpus": 1},
        )


def test_a_create_needs_sub_jobs_and_a_safe_job_id():
    sub = {"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 1}}
    CreateJobRequest.model_validate({"sub_job_configs": [sub], "job_id": "run-1.a_b"})
    with pytest.raises(ValidationError):
        CreateJobRequest.model_validate({"sub_job_configs": []})
    for bad in ("../x", "a:b", "", "x" * 65):
        with pytest.raises(ValidationError):
            CreateJobRequest.model_validate({"sub_job_configs": [sub], "job_id": bad})
