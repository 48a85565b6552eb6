"""``ray_auto_attach`` with a ``RAY_ADDRESS`` nothing answers at: a WARNING naming the address
and the reason, then a fresh loopback cluster, and ``status`` says which cluster jobs run on."""

from __future__ import annotations

import os
import socket
import textwrap

import pytest
from support.programs import run_ray_program

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
    env = {**os.environ, "RAY_ADDRESS": address}
    cluster, stderr = run_ray_program(PROGRAM, [str(tmp_path / "run")], env, timeout=300)
    assert cluster["mode"] == "loopback" and cluster["started_here"] is True
    assert cluster["attached"] is False
    assert cluster["attach_refused"].startswith(f"{address}: cannot reach it")
    warning = [line for line in stderr.splitlines() if line.startswith("WARNING")]
    assert any(address in line and "cannot reach it" in line for line in warning), warning
    assert all(n["address"] == "127.0.0.1" for n in cluster["nodes"])
