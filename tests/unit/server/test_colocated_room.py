"""A colocated job that no shared GPU bundle has room for is refused when it is created (a 422
naming the bundle), instead of waiting for a bundle that never frees."""

from __future__ import annotations

import pytest

from arctic_platform.rl.errors import InvalidRequestError
from arctic_platform.rl.server.jobs import JobManager
from arctic_platform.rl.server.placement import (
    WORKERS_PER_COLOCATED_BUNDLE,
    check_colocated_room,
)


def test_three_workers_fit_a_bundle_and_a_fourth_is_refused_naming_it():
    assert WORKERS_PER_COLOCATED_BUNDLE == 3
    check_colocated_room(1, [1, 1])
    with pytest.raises(InvalidRequestError, match="bundle 0 already holds 3"):
        check_colocated_room(1, [1, 1, 1])
    check_colocated_room(2, [2, 1])  # bundle 1 holds one worker
    with pytest.raises(InvalidRequestError, match="bundle 0 already holds 3"):
        check_colocated_room(2, [2, 2, 2])


def test_the_manager_refuses_a_fourth_live_colocated_job_and_takes_one_after_a_destroy(
    tmp_path, monkeypatch
):
    manager = JobManager(tmp_path)
    monkeypatch.setattr(manager, "_start_thread", lambda job: None)  # no Ray: placement only
    gpus = {"training_gpus": 1, "sampling_gpus": 1, "log_prob_gpus": 1}
    config = {"model_name": "m", "colocate": True, **gpus}
    jobs = [manager.create(t, config) for t in ("training", "sampling", "log_prob")]
    with pytest.raises(InvalidRequestError, match="colocate=false"):
        manager.create("sampling", config)
    assert len(manager.jobs) == 3  # nothing registered
    manager.create("sampling", {**config, "colocate": False})  # a GPU of its own: no check
    jobs[1].set_state(jobs[1].state.__class__.TERMINATED, reason="destroyed")
    manager.create("sampling", config)  # the destroyed job's place


def test_colocation_groups_count_their_own_workers_and_are_kept_in_the_job_table(
    tmp_path, monkeypatch
):
    from arctic_platform.rl.server.job_state import Job

    manager = JobManager(tmp_path)
    monkeypatch.setattr(manager, "_start_thread", lambda job: None)  # no Ray: placement only
    config = {"model_name": "m", "colocate": True, "training_gpus": 1, "sampling_gpus": 1}
    for _ in range(3):
        manager.create("sampling", config, colocation_group="gpu-0")
    with pytest.raises(InvalidRequestError, match="bundle 0 already holds 3"):
        manager.create("sampling", config, colocation_group="gpu-0")
    other = manager.create("training", config, colocation_group="gpu-1")  # its own bundles
    default = manager.create("training", config)  # the server's default set is a third one
    assert (other.colocation_group, default.colocation_group) == ("gpu-1", None)
    assert Job.from_record(other.record()).colocation_group == "gpu-1"
    assert other.describe()["colocation_group"] == "gpu-1"
    with pytest.raises(InvalidRequestError, match="colocate=true"):
        manager.create("training", {**config, "colocate": False}, colocation_group="gpu-2")
