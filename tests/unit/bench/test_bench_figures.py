"""The benchmarks' own use of bench.timing, on fake sides: the figures they record keep their keys.

No engine, model or server is started (one short-lived ``arctic_platform.rl.cli`` that exits at
once checks the server helper's error path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import tinker, transport
from bench.servers import start_server, stop_server


def test_transport_pairs_report_worker_share() -> None:
    worker = {"seconds": 0.0, "calls": 0}

    def through() -> None:
        worker["calls"] += 1
        worker["seconds"] += 1.0  # the worker's running total grows 1 s a call

    out = transport._paired(lambda: None, through, 3, lambda: worker["seconds"], warmup=2)
    assert worker["calls"] == 5
    assert set(out) == {"direct_s", "through_s", "paired_ratio", "worker_s", "over_worker"}
    assert out["worker_s"] == 1.0
    assert 0 < out["over_worker"] < 1  # a call's wall time over 1 s of "worker" time


def test_transport_pairs_without_worker_counter() -> None:
    out = transport._paired(lambda: None, lambda: None, 2, warmup=0)
    assert set(out) == {"direct_s", "through_s", "paired_ratio"}


def test_tinker_rounds_keep_parts_and_cpu() -> None:
    calls: list[str] = []

    def side(name: str) -> dict[str, float]:
        calls.append(name)
        return {phase: 0.01 for phase in tinker.PHASES}

    timing = tinker._paired(
        {"tinker": lambda: side("t"), "arctic_rl_client": lambda: side("a")},
        repeats=2,
        servers={"tinker": None, "arctic_rl_client": None},
        warmup=1,
    )
    assert calls == ["t", "a", "t", "a", "a", "t"]
    rounds = tinker._round_records(timing)
    assert len(rounds) == 2
    for r in rounds:
        assert set(r) == {"tinker", "arctic_rl_client", "ratio", "load_1min"}
        parts = {"total", "client_cpu", "server_cpu", *tinker.PHASES}
        assert set(r["tinker"]) == parts
        assert r["tinker"]["server_cpu"] == 0.0
        assert r["ratio"] == r["tinker"]["total"] / r["arctic_rl_client"]["total"]
    assert timing.median("tinker", "sample") == 0.01


def test_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError, match="exited") as err:
        start_server(["no-such-command"], health_url="http://127.0.0.1:9/", log=log, timeout=60)
    assert "no-such-command" in str(err.value)
    assert log.read_text()  # the usage error went to the log


def test_stop_server_ends_a_running_process() -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop_server(proc, timeout=10)
    assert proc.poll() is not None
