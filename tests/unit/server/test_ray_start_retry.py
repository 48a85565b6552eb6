"""Starting a fresh Ray cluster again when Ray's node start-up times out (a stand-in for the
``ray`` module: the real time-out needs a machine loaded enough to miss Ray's fixed 30 s)."""

from __future__ import annotations

import pytest

from arctic_platform.rl.server.ray_cluster import init_fresh_cluster

TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the "
    "raylet failed to startup or the GCS has become overloaded."
)


class StandInRay:
    """Fails ``init`` with each of ``failures`` in turn, then starts."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls: list[dict] = []
        self.initialized = False

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if self.failures:
            raise self.failures.pop(0)
        self.initialized = True

    def is_initialized(self) -> bool:
        return self.initialized

    def shutdown(self) -> None:
        self.initialized = False


def test_a_start_up_time_out_is_tried_again_with_the_same_arguments(caplog):
    ray = StandInRay(Exception(TIMED_OUT), Exception(TIMED_OUT))
    init_fresh_cluster(ray, address="local", num_cpus=8)
    assert ray.initialized and ray.calls == [{"address": "local", "num_cpus": 8}] * 3
    assert "try 1 of 3" in caplog.text and "try 2 of 3" in caplog.text


def test_the_last_time_out_and_any_other_error_are_raised_at_once():
    ray = StandInRay(*[Exception(TIMED_OUT)] * 3)
    with pytest.raises(Exception, match="timed out during startup"):
        init_fresh_cluster(ray, address="local")
    assert len(ray.calls) == 3
    other = StandInRay(ValueError("bad num_cpus"))
    with pytest.raises(ValueError, match="bad num_cpus"):
        init_fresh_cluster(other, address="local")
    assert len(other.calls) == 1
