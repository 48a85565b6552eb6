"""Processes a stopped Ray cluster left behind: listed from /proc, ended by PID only."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from arctic_platform.rl.server.leftovers import descendants, end_leftovers, ray_processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _pids(processes) -> set[int]:
    return {pid for pid, _ in processes}


@pytest.fixture
def spawned():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_descendants_and_ray_processes_list_the_tree_under_ray_children_only(spawned):
    # a "Ray" child (argv[0] ray::..., as Ray names its workers) with a child of its own,
    # and a user's child that is not Ray's
    ray_like = subprocess.Popen(["bash", "-c", "exec -a ray::Fake bash -c 'sleep 60 & wait'"])
    users = subprocess.Popen(["sleep", "60"])
    spawned += [ray_like, users]
    _wait_for(lambda: len(descendants(ray_like.pid)) == 1)
    grandchild = descendants(ray_like.pid)[0][0]
    mine = _pids(descendants(os.getpid()))
    assert {ray_like.pid, users.pid, grandchild} <= mine
    ray = _pids(ray_processes(os.getpid()))
    assert {ray_like.pid, grandchild} <= ray and users.pid not in ray


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_and_named(spawned):
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN])
    quitting = subprocess.Popen(["sleep", "0.2"])
    spawned += [stubborn, quitting]
    _wait_for(lambda: len(descendants(os.getpid())) >= 2)
    listed = [p for p in descendants(os.getpid()) if p[0] in (stubborn.pid, quitting.pid)]
    assert _pids(listed) == {stubborn.pid, quitting.pid}
    assert end_leftovers(listed, grace=2.0) == [stubborn.pid]
    assert stubborn.wait(timeout=10) == -9
    assert quitting.wait(timeout=10) == 0


def test_a_pid_taken_by_another_process_is_not_signalled(spawned):
    other = subprocess.Popen([sys.executable, "-c", STUBBORN])
    spawned.append(other)
    _wait_for(lambda: other.pid in _pids(descendants(os.getpid())))
    (listed,) = [p for p in descendants(os.getpid()) if p[0] == other.pid]
    assert end_leftovers([(other.pid, listed[1] + 1)], grace=0.1) == []  # another start time
    assert other.poll() is None
