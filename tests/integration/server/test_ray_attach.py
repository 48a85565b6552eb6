"""``ray_auto_attach`` with a ``RAY_ADDRESS`` nothing answers at: a WARNING naming the address
and the reason, then a fresh loopback cluster, and ``status`` says which cluster jobs run on."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from arctic_platform.rl.server.ray_cluster import start_or_attach
    cluster = start_or_attach(num_gpus=1, run_dir=Path(sys.argv[1]), num_cpus=2)
    try:
        print("RESULT " + json.dumps(cluster.describe()))
    finally:
        cluster.shutdown()
    """
)


def test_an_unreachable_ray_address_is_a_warning_and_a_fresh_loopback_cluster(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    ray_tmp = tempfile.mkdtemp(prefix="arl-", dir="/tmp")  # Ray's socket paths must be short
    env = {**os.environ, "RAY_ADDRESS": address, "ARCTIC_RL_RAY_TMP": ray_tmp}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert out, done.stderr[-4000:]
    cluster = json.loads(out[0][len("RESULT ") :])
    assert cluster["mode"] == "loopback" and cluster["started_here"] is True
    assert cluster["attached"] is False
    assert cluster["attach_refused"].startswith(f"{address}: cannot reach it")
    warning = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert any(address in line and "cannot reach it" in line for line in warning), warning
    assert all(n["address"] == "127.0.0.1" for n in cluster["nodes"])
