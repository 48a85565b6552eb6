"""A small soak of the Ray cluster a server starts: the GCS's memory levels off.

Ray's GCS keeps the events of its last 100 000 tasks by default, about 2 KB each, then the
ids of up to 1 000 000 evicted ones; a training step makes about ten actor calls, so a long
run's ``gcs_server`` grew by ~23 KB a step (issue 27). ``start_or_attach`` bounds both for a
cluster it starts (``TASK_EVENTS_KEPT``, 10 000; set to ``KEPT`` here so the test is short).
A fresh cluster runs ``CALLS`` cheap actor calls (several times that bound) and the GCS's
resident memory is read every ``EVERY`` calls. The same run with Ray's own defaults is the
control: over the second half (a least-squares trend, no clock involved) the control must
still grow by more than ``GROWING_BYTES_PER_CALL`` a call, and ours by less than
``FLAT_SHARE`` of it. What is left of ours arrives in steps (1-5 MB every ~5 000 calls, the
heap growing), so a short window is noise: over calls 6 000-12 000 ours measured 0-1 020 B a call
against 3 040-3 470 (it failed the bound once at 0.29), over 15 000-30 000 165-410 against
2 390-2 540 (a 30 000-call run takes ~12 s on a quiet machine).
"""

from __future__ import annotations

import os
import textwrap

import pytest
from support.programs import run_ray_program

pytestmark = pytest.mark.slow

CALLS, EVERY, KEPT = 30_000, 1_500, 500
FLAT_SHARE = 0.25
GROWING_BYTES_PER_CALL = 1_000
RAY_DEFAULTS = {
    "RAY_task_events_max_num_task_in_gcs": "100000",
    "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs": "1000000",
}

PROGRAM = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import psutil
    import arctic_platform.rl.server.ray_cluster as ray_cluster
    calls, every = int(sys.argv[2]), int(sys.argv[3])
    ray_cluster.TASK_EVENTS_KEPT = int(sys.argv[4])
    cluster = ray_cluster.start_or_attach(num_gpus=1, run_dir=Path(sys.argv[1]), num_cpus=2)
    try:
        import ray

        @ray.remote(num_cpus=0)
        class Echo:
            def ping(self) -> int:
                return 0

        echo = Echo.remote()
        ray.get(echo.ping.remote())
        gcs = [p for p in psutil.Process().children(recursive=True) if "gcs_server" in p.name()]
        assert len(gcs) == 1, [p.name() for p in psutil.Process().children(recursive=True)]
        points = []
        for done in range(0, calls + 1, every):
            if done:
                for _ in range(every // 200):
                    ray.get([echo.ping.remote() for _ in range(200)])
            points.append((done, gcs[0].memory_info().rss))
        print("RESULT " + json.dumps(points))
    finally:
        cluster.shutdown()
    """
)


def _slope(points: list[tuple[int, int]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def _second_half_growth(tmp_path, extra_env: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in RAY_DEFAULTS}
    env.update(extra_env)
    env.pop("RAY_ADDRESS", None)
    args = [str(tmp_path / "run"), str(CALLS), str(EVERY), str(KEPT)]
    result, _ = run_ray_program(PROGRAM, args, env, timeout=600)
    points = [tuple(p) for p in result]
    half = [p for p in points if p[0] >= CALLS // 2]
    return _slope(half)


def test_the_gcs_of_a_cluster_we_start_levels_off_and_with_rays_defaults_it_grows(tmp_path):
    bounded = _second_half_growth(tmp_path / "ours", {})
    unbounded = _second_half_growth(tmp_path / "rays", RAY_DEFAULTS)
    print(f"gcs_server, calls {CALLS // 2}-{CALLS}: {bounded:.0f} B a call (ours)")
    print(f"gcs_server, calls {CALLS // 2}-{CALLS}: {unbounded:.0f} B a call (Ray's defaults)")
    assert unbounded > GROWING_BYTES_PER_CALL, f"the control grows {unbounded:.0f} B a call only"
    assert bounded < FLAT_SHARE * unbounded, (bounded, unbounded)
