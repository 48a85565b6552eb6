"""Client and server crashes over the ``ray`` transport (RLServer as a detached Ray actor).

One deterministic training job K on a server started as ``arctic-rl serve --transport ray``.
Clients are Ray drivers: a driver SIGKILLed between ``fwd_bwd`` and ``step`` is replaced by a
new one that finishes the loop (the repeated ``fwd_bwd`` is answered, not applied again); then
the serve process (and with it the Ray cluster and the server actor) is SIGKILLed after a
checkpoint; the next client's local backend finds the job table and starts ``serve --resume
RUN_DIR``, which brings K back with its id, and K retraces the losses it had reached after
that checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fault_loop import DETERMINISTIC, LOSS, batch
from processes import kill_loop_after_fwd_bwd
from support import servers
from support.clients import arctic_home, client_config
from support.servers import arctic_rl, descendants

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.run_dirs import server_run_dir

pytestmark = pytest.mark.slow

LOOP = os.path.join(os.path.dirname(__file__), "fault_loop.py")
STEPS = 6


def _launch(run_dir, *args: str) -> subprocess.Popen:
    started = time.time()
    address = run_dir / "ray_address"  # written once the server actor answers

    def written() -> bool:
        return address.exists() and address.stat().st_mtime >= started - 1

    what = f"the ray server's {address} (written once its actor answers)"
    return servers.spawn(arctic_rl("serve", *args), run_dir / "test-server.log", written, what)


@pytest.fixture(scope="module")
def ray_server(tiny_model_path, tmp_path_factory):
    """``(run_dir, config, processes)`` of a ray-transport server this module started."""
    with arctic_home(tmp_path_factory.mktemp("arctic-home")):
        run_dir = server_run_dir(None, None, "ray")
        run_dir.mkdir(parents=True)
        state = {"proc": _launch(run_dir, "--transport", "ray", "--run-dir", str(run_dir),
                                 "--num-gpus", "1", "--no-ray-auto-attach")}  # fmt: skip
        config = client_config(
            tiny_model_path,
            comm_protocol="ray",
            host=None,
            sampling_gpus=0,
            log_prob_gpus=0,
            **DETERMINISTIC,
        )
        pids: set[int] = set()
        yield run_dir, config, state, pids
        pids |= descendants(state["proc"].pid)
        servers.stop(state["proc"], grace=120)  # SIGTERM stops the server actor and its cluster
        servers.reap(pids)


def test_a_killed_ray_driver_is_replaced_and_the_repeated_fwd_bwd_is_not_applied_twice(
    ray_server, tmp_path
):
    _, config, _, _ = ray_server
    client = ArcticRLClient(config, progress=False)  # creates K on the running server
    try:
        client.fwd_bwd(batch(0), LOSS, request_id="fb-0")
        client.step(request_id="st-0")
        config_file, log_file = tmp_path / "reconnect.json", tmp_path / "loop.jsonl"
        config_file.write_text(client.reconnect_config().model_dump_json())
    finally:
        client.close()  # leave the Ray cluster; the job stays
    command = [sys.executable, LOOP, str(config_file), str(log_file), str(STEPS)]
    kill_loop_after_fwd_bwd(command, log_file, 2)  # before step(2)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [r["i"] for r in records if r.get("replayed")] == [2]
    steps = [r["global_step"] for r in records if r["phase"] == "step"]
    assert steps == list(range(2, STEPS + 1))  # each step once, none lost, none twice


def test_a_killed_ray_server_resumes_its_job_from_the_checkpoint_with_the_same_id(ray_server):
    run_dir, config, state, pids = ray_server
    job_id = json.loads((run_dir / "job_table.json").read_text())["jobs"][0]["job_id"]
    client = ArcticRLClient(config.for_reconnect(training_job_id=job_id), progress=False)
    try:
        client.save_checkpoint()
        saved = client.job_info("training")["global_step"]
        expected = []
        for i in (saved, saved + 1):  # lost in the crash, to be retraced
            expected.append(client.fwd_bwd(batch(i), LOSS)["loss"])
            client.step()
    finally:
        client.close()

    pids |= descendants(state["proc"].pid)
    state["proc"].send_signal(signal.SIGKILL)
    state["proc"].wait()
    servers.reap(pids)  # the cluster went down with the process that started it

    # the local backend finds the dead server's job table and starts `serve --resume` itself
    client = ArcticRLClient(config.for_reconnect(training_job_id=job_id), progress=False)
    server = client.backend.process  # type: ignore[attr-defined]
    assert server is not None and "--resume" in server.args
    state["proc"] = server
    try:
        assert client.job_info("training")["global_step"] == saved
        got = []
        for i in (saved, saved + 1):
            got.append(client.fwd_bwd(batch(i), LOSS)["loss"])
            client.step()
        assert got == expected
    finally:
        client.close()
