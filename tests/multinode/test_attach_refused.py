"""A cluster without GPU resources is not attached to: the server says so in a WARNING naming
the address and the reason, and runs its jobs on a fresh local cluster on loopback."""

from __future__ import annotations

import json


def test_a_cluster_without_gpus_is_named_in_a_warning_and_not_used(netns_cluster_factory):
    cluster = netns_cluster_factory(workers=0, clients=0)  # a head with no GPUs only
    code = (
        "import json, logging, sys\n"
        "from pathlib import Path\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "from arctic_platform.rl.server.ray_cluster import start_or_attach\n"
        f"c = start_or_attach(num_gpus=1, run_dir=Path({str(cluster.run_dir / 'srv')!r}),"
        " num_cpus=2)\n"
        "print('RESULT ' + json.dumps(c.describe()))\n"
        "c.shutdown()\n"
    )
    env = cluster.driver_env({"ARCTIC_RL_RAY_TMP": str(cluster.run_dir)})
    done = cluster.exec_python(0, code, env=env, timeout=300)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stderr[-4000:]
    described = json.loads(lines[0][len("RESULT ") :])
    assert described["mode"] == "loopback" and described["started_here"] is True
    assert described["attach_refused"] == (
        f"{cluster.head_address}: it has no GPU resources (start its nodes with "
        "`ray start --num-gpus N`)"
    )
    warnings = [x for x in done.stderr.splitlines() if x.startswith("WARNING")]
    assert any(cluster.head_address in x and "no GPU resources" in x for x in warnings), warnings
