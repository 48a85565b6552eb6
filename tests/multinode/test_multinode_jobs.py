"""Jobs on a real multi-node Ray cluster: a head (no GPUs) and four one-GPU worker nodes, each
in its own network namespace; the server in the head's namespace, clients in another.

The server attaches to the cluster through ``RAY_ADDRESS`` (default ``ray_auto_attach``); the
training world of two spans two nodes, sampling and log-prob run on the other two; weight sync
crosses nodes. Then faults: a worker node cut off (link down) and one killed.
Tests run in file order and share the cluster, the server and its jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from netns_cluster import NetnsCluster
from support.leaks import files_holding

HERE = Path(__file__).resolve().parent
PORT = 7000
SYNC_TIMEOUT = 30.0
STATE: dict[str, Any] = {}  # what the earlier tests left for the later ones


class Server:
    """``arctic-rl serve`` in the head's namespace, and how clients reach it."""

    def __init__(self, cluster: NetnsCluster, home: Path, run_dir: Path, token: str) -> None:
        self.cluster, self.home, self.run_dir, self.token = cluster, home, run_dir, token
        self.host = cluster.head.ip
        self.log = run_dir / "server.out"
        self.proc: subprocess.Popen[Any] | None = None

    def env(self) -> dict[str, str]:
        return self.cluster.driver_env({"ARCTIC_RL_HOME": str(self.home)})

    def start(self) -> None:
        argv = [
            self.cluster.python, "-m", "arctic_platform.rl.cli", "serve",
            "--host", self.host, "--port", str(PORT), "--transport", "http",
            "--token-file", str(self.run_dir / "token"), "--run-dir", str(self.run_dir),
            "--sync-timeout", str(SYNC_TIMEOUT),
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = self.cluster.run_in(
                0, argv, self.env(), stdout=out, stderr=subprocess.STDOUT
            )

    def ops(self, *ops: tuple[str, dict[str, Any] | None], timeout: float = 900) -> list[dict]:
        """Run operations from the client namespace; their answers in order."""
        spec = {"host": self.host, "port": PORT, "token": self.token, "ops": list(ops)}
        return self._client_script("client_ops.py", "ops", spec, timeout)

    def status(self) -> dict[str, Any]:
        answer = self.ops(("status", None), timeout=120)[0]
        assert answer["ok"], answer
        return answer["result"]

    def run_client(self, spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
        """``loop_client.py`` with ``spec`` in the client namespace; its RESULT."""
        return self._client_script("loop_client.py", "loop", spec, timeout)

    def _client_script(self, script: str, kind: str, spec: Any, timeout: float) -> Any:
        """Run ``script`` in the client namespace on ``spec`` (a json file); its RESULT."""
        path = self.run_dir.parent / f"{kind}-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(spec))
        done = self.cluster.exec_python(
            self.cluster.client_hosts[0],
            HERE / script,
            [str(path)],
            env=self.env(),
            timeout=timeout,
        )
        return _result(done)


def _result(done: subprocess.CompletedProcess[str]) -> Any:
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(
        f"no RESULT (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )


@pytest.fixture(scope="module")
def server(netns_cluster: NetnsCluster) -> Server:
    """The server, attached to the namespace cluster and healthy."""
    from arctic_platform.rl.run_dirs import write_private

    home = netns_cluster.run_dir / "arctic-home"
    run_dir = home / "servers" / f"http_{netns_cluster.head.ip}_{PORT}"  # the local backend's
    run_dir.mkdir(parents=True)
    token = os.urandom(24).hex()
    write_private(run_dir / "token", token)
    srv = Server(netns_cluster, home, run_dir, token)
    srv.start()
    deadline = time.monotonic() + 300
    while True:
        assert srv.proc is not None
        if srv.proc.poll() is not None:
            raise AssertionError(f"the server exited:\n{srv.log.read_text()[-4000:]}")
        try:
            if srv.ops(("health", None), timeout=60)[0]["ok"]:
                return srv
        except AssertionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"server not healthy:\n{srv.log.read_text()[-4000:]}")
        time.sleep(2)


def _config(server: Server, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model_name": model,
        "host": server.host,
        "port": PORT,
        "training_gpus": 2,
        "sampling_gpus": 1,
        "log_prob_gpus": 1,
        "ds_config": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
        "server_logs": False,
        "startup_timeout": 120,
        "job_ready_timeout": 1500,
        "training_config": {"optimizer": {"lr": 1e-3}},
        **extra,
    }


def _jobs(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The newest job of each type."""
    out: dict[str, dict[str, Any]] = {}
    for job in status["jobs"]:
        out[job["job_type"]] = job
    return out


def _wait_state(server: Server, job_id: int, states: set[str], limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while True:
        job = next(j for j in server.status()["jobs"] if j["job_id"] == job_id)
        if job["state"] in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['state']} after {limit}s: {job}")
        time.sleep(2)


def test_the_server_attaches_to_the_cluster_and_reports_its_nodes(server, netns_cluster):
    cluster = server.status()["cluster"]
    assert cluster["mode"] == "cluster" and cluster["attached"] is True
    assert cluster["address"] == netns_cluster.head_address
    assert cluster["server_node"] == netns_cluster.head.ip
    alive = {n["address"] for n in cluster["nodes"] if n["alive"]}
    assert alive == set(netns_cluster.node_ips) - {h.ip for h in netns_cluster.client_hosts}
    assert cluster["gpus"] == len(netns_cluster.worker_hosts)
    assert "attached to the Ray cluster at" in server.log.read_text()


def test_the_whole_loop_runs_across_nodes(server, netns_cluster, tiny_model_path):
    result = server.run_client({"phase": "loop", "config": _config(server, tiny_model_path)})
    STATE["loop"] = result
    assert result["weight_version_after"] == result["weight_version_before"] + 1
    assert result["sync"]["bytes"] > 0
    assert result["gap_trainer_vs_sampler_step0"] <= 1e-3
    assert result["gap_trainer_vs_logprob_step0"] <= 1e-3
    assert result["gap_trainer_vs_logprob_after_sync"] <= 1e-3
    norms = result["norms"]
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-5)
    assert result["global_step"] == 1


def test_jobs_are_placed_on_the_nodes_the_status_names_and_ray_agrees(server, netns_cluster):
    jobs = _jobs(STATE["loop"]["status"])
    nodes = {t: [n["address"] for n in j["worker_nodes"]] for t, j in jobs.items()}
    workers = {h.ip for h in netns_cluster.worker_hosts}
    assert len(nodes["training"]) == 2 and len(set(nodes["training"])) == 2  # one world, 2 nodes
    used = nodes["training"] + nodes["sampling"] + nodes["log_prob"]
    assert len(used) == len(set(used)) == 4 and set(used) == workers  # head has no GPU
    # the Ray actor table (read from the GCS by a driver in the head's namespace)
    code = (
        "import json, ray\n"
        f"ray.init(address={netns_cluster.head_address!r}, log_to_driver=False)\n"
        "rows = [(a['ActorClassName'], a['Address']['IPAddress'], a['State'])"
        " for a in ray._private.state.actors().values()]\n"
        "print('RESULT ' + json.dumps(rows))\n"
    )
    done = netns_cluster.exec_python(0, code, env=server.env(), timeout=300)
    rows = _result(done)
    alive = sorted(ip for cls, ip, state in rows if cls == "EngineWorker" and state == "ALIVE")
    assert alive == sorted(used)


def test_prometheus_in_a_client_namespace_scrapes_the_workers_of_every_node(server, netns_cluster):
    from arctic_platform.rl.observe import prometheus as launcher
    from arctic_platform.rl.observe.discovery import TARGETS_FILE

    ray_nodes = set(netns_cluster.node_ips) - {h.ip for h in netns_cluster.client_hosts}
    targets_file = server.run_dir / TARGETS_FILE
    deadline = time.monotonic() + 60
    listed: set[str] = set()
    while listed != ray_nodes and time.monotonic() < deadline:
        if targets_file.is_file():
            document = json.loads(targets_file.read_text())
            listed = {t.rsplit(":", 1)[0] for t in document[0]["targets"]}
        time.sleep(1)
    assert listed == ray_nodes  # the server's discovery file names every node's endpoint
    client = netns_cluster.client_hosts[0]
    url = f"http://{client.ip}:19090"
    argv = launcher.command(server.run_dir, host=client.ip, port=19090, scrape_seconds=2)
    with open(server.run_dir.parent / "prometheus.out", "ab") as out:
        prom = netns_cluster.run_in(client, argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        workers = sorted(h.ip for h in netns_cluster.worker_hosts)
        spec = server.run_dir.parent / "prom-check.json"
        spec.write_text(json.dumps({"url": url, "worker_nodes": workers, "timeout": 150}))
        done = netns_cluster.exec_python(
            client, HERE / "prom_check.py", [str(spec)], env=server.env(), timeout=240
        )
        seen = _result(done)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
    # every worker node's engine workers (two training ranks, sampling, log-prob) and the
    # server on the head, through the one scrape job over the discovery file
    assert set(workers) <= set(seen["engine_nodes"]), seen
    assert seen["server_nodes"] == [netns_cluster.head.ip], seen
    assert {t.rsplit(":", 1)[0] for t in seen["targets_up"]} == ray_nodes, seen


def test_a_client_in_another_namespace_reconnects_and_continues(server):
    config = STATE["loop"]["reconnect"]
    result = server.run_client({"phase": "reconnect", "config": config})
    assert result["idle_applied"] is False and result["idle_step"] == 1
    assert result["step"] == 2
    assert result["loaded"] == 1  # the checkpoint saved at step 1


def test_a_zero2_world_across_nodes_trains_checkpoints_and_syncs(server, tiny_model_path):
    jobs = _jobs(server.status())
    old = jobs["training"]
    assert server.ops(("destroy", {"job_id": old["job_id"]}))[0]["ok"]  # frees its 2 GPUs
    config = _config(server, tiny_model_path, ds_config={"zero_optimization": {"stage": 2}})
    made = server.ops(("initialize", {"job_type": "training", "config": config}))[0]
    assert made["ok"], made
    job_id = made["result"]["job_id"]
    trainer = _wait_state(server, job_id, {"running", "failed"}, limit=1200)
    assert trainer["state"] == "running", trainer
    assert len({n["address"] for n in trainer["worker_nodes"]}) == 2
    batch = {"input_ids": [[1, 5, 6, 7, 8], [2, 9, 4]], "advantages": [1.0, -1.0]}
    targets = {
        "training_job_id": job_id,
        "sampling_job_ids": [jobs["sampling"]["job_id"]],
        "log_prob_job_ids": [jobs["log_prob"]["job_id"]],
    }
    answers = server.ops(
        ("fwd_bwd", {"job_id": job_id, "batch": batch, "loss_fn": "importance_sampling"}),
        ("step", {"job_id": job_id}),
        ("save_checkpoint", {"job_id": job_id}),
        ("fwd_bwd", {"job_id": job_id, "batch": batch, "loss_fn": "importance_sampling"}),
        ("step", {"job_id": job_id}),
        ("load_checkpoint", {"job_id": job_id}),
        ("sync_weights", targets),
        ("weight_norm", {"job_ids": [job_id, *targets["sampling_job_ids"]]}),
    )
    assert all(a["ok"] for a in answers), [a for a in answers if not a["ok"]]
    assert answers[1]["result"]["global_step"] == 1 and answers[4]["result"]["global_step"] == 2
    assert answers[5]["result"]["global_step"] == 1  # back at the saved step
    norms = answers[7]["result"]["norms"]
    assert norms[str(jobs["sampling"]["job_id"])]["norm"] == pytest.approx(
        norms[str(job_id)]["norm"], rel=1e-5
    )


def _greedy(answer: dict[str, Any]) -> tuple[int, list[Any]]:
    """A generate answer's weight version and each completion's tokens and version."""
    result = answer["result"]
    tokens = [
        (c["token_ids"], c["weight_version_end"])
        for out in result["outputs"]
        for c in out["completions"]
    ]
    return result["weight_version"], tokens


def _norms(answer: dict[str, Any]) -> dict[str, float]:
    return {job: n["norm"] for job, n in answer["result"]["norms"].items()}


def test_a_cut_link_fails_the_jobs_there_and_the_rest_keep_serving(server, netns_cluster):
    jobs = _jobs(server.status())
    log_prob, sampling, trainer = jobs["log_prob"], jobs["sampling"], jobs["training"]
    node = log_prob["worker_nodes"][0]["address"]
    serving = (
        ("generate", {"job_id": sampling["job_id"], "prompts": ["12 + 30 ="],
                      "sampling_params": {"max_tokens": 4, "temperature": 0.0}}),
        ("weight_norm", {"job_ids": [trainer["job_id"], sampling["job_id"]]}),
    )  # fmt: skip
    before = server.ops(*serving)
    assert all(a["ok"] for a in before), before
    netns_cluster.link_down(node)
    try:
        # a sync whose receiver is cut off fails with the sender's own timeout (--sync-timeout)
        sync = server.ops(
            (
                "sync_weights",
                {
                    "training_job_id": trainer["job_id"],
                    "sampling_job_ids": [],
                    "log_prob_job_ids": [log_prob["job_id"]],
                },
            ),
            timeout=600,
        )[0]
        assert not sync["ok"], sync
        # the weight sync's own error (a failed transfer, 502), not a 500, nor the 504 of the
        # server's outer wait (2 * timeout + 30 s) or a dead worker's 409
        assert (sync["status"], sync["code"]) == (502, "weight_sync_failed"), sync
        assert "did not arrive on port" in sync["message"], sync
        assert f"within {SYNC_TIMEOUT}s" in sync["message"], sync
        # the sender waits the whole timeout for the receiver's hello, then gives up; the
        # margin (30 s) covers choosing the pair ports on the trainer's nodes, the Ray task
        # round trips and the answer on the loaded 2-core machine, and stays below the
        # server's outer limit (2 * SYNC_TIMEOUT + 30 s), so a sync that only that limit ended
        # fails here
        assert SYNC_TIMEOUT <= sync["seconds"] < SYNC_TIMEOUT + 30, sync
        failed = _wait_state(server, log_prob["job_id"], {"failed"}, limit=300)
        assert node in failed["reason"], failed
        after = server.ops(
            ("log_probs", {"job_id": log_prob["job_id"], "prompts": [[1]], "completions": [[3]]}),
            *serving,
            ("health", None),
        )
        assert after[0]["status"] == 409 and after[0]["seconds"] < 30, after[0]
        assert all(a["ok"] for a in after[1:]), after
        # the old weights still serve: same version, same norms, same greedy completion
        assert _greedy(after[1]) == _greedy(before[0]), (before[0], after[1])
        assert _norms(after[2]) == pytest.approx(_norms(before[1]), rel=1e-6)
        versions = {j["job_id"]: j["weight_version"] for j in server.status()["jobs"]}
        assert versions[log_prob["job_id"]] == log_prob["weight_version"]
        assert versions[sampling["job_id"]] == sampling["weight_version"]
    finally:
        netns_cluster.link_up(node)
    STATE["cut_node"] = node


def test_a_killed_node_fails_its_job_and_a_restart_places_it_on_remaining_capacity(
    server, netns_cluster
):
    jobs = _jobs(server.status())
    sampling = jobs["sampling"]
    node = sampling["worker_nodes"][0]["address"]
    killed = netns_cluster.kill_node(node)  # SIGKILL every process in its namespace
    assert killed and netns_cluster.pids(node) == []
    failed = _wait_state(server, sampling["job_id"], {"failed"}, limit=300)
    assert node in failed["reason"], failed
    answers = server.ops(
        ("generate", {"job_id": sampling["job_id"], "prompts": ["1"], "sampling_params": {}}),
        ("weight_norm", {"job_ids": [jobs["training"]["job_id"]]}),
    )
    assert answers[0]["status"] == 409 and answers[0]["seconds"] < 30, answers[0]
    assert answers[1]["ok"], answers[1]
    # no free GPU is left (one node cut off, one killed, two train): the restart waits
    restarted = server.ops(("restart_job", {"job_id": sampling["job_id"]}))[0]
    assert restarted["ok"], restarted
    waiting = _wait_state(server, sampling["job_id"], {"placing"}, limit=120)
    assert waiting["state"] == "placing"
    # freeing the trainer's two GPUs lets it be placed there
    assert server.ops(("destroy", {"job_id": jobs["training"]["job_id"]}))[0]["ok"]
    running = _wait_state(server, sampling["job_id"], {"running", "failed"}, limit=900)
    assert running["state"] == "running", running
    assert running["worker_nodes"][0]["address"] != node
    out = server.ops(
        ("generate", {"job_id": sampling["job_id"], "prompts": ["12 + 30 ="],
                      "sampling_params": {"max_tokens": 4, "temperature": 0.0}}),
    )[0]  # fmt: skip
    assert out["ok"], out


def test_no_token_is_written_to_the_job_table_or_the_logs(server, netns_cluster):
    """Every file a token could reach: the cluster's run dir holds the server's ARCTIC_RL_HOME
    (its run dir: server log, job table and change log, job logs; the clients' state), the
    ``ray start`` logs and Ray's temp dir (every node's session logs)."""
    cluster_dir = netns_cluster.run_dir
    for written in (server.log, server.run_dir / "job_table.json"):
        assert written.is_file(), written
    sessions = sorted({p.resolve() for p in (cluster_dir / "ray").glob("session_*/logs")})
    assert sessions and any(p.is_file() for p in sessions[0].rglob("*")), "no Ray session logs"
    token_files = {(server.run_dir / "token").resolve(), netns_cluster.token_path.resolve()}

    def skip(path: Path) -> bool:
        # the token files, and this test's own request specs (they carry the token to the
        # client processes: ``Server.ops``/``run_client``)
        return path in token_files or (
            path.parent == server.run_dir.parent and path.name.startswith(("ops-", "loop-"))
        )

    secrets = {
        "the server token": server.token,
        "the Ray token": netns_cluster.token_path.read_text().strip(),
    }
    leaks = files_holding(secrets, [cluster_dir, server.home, *sessions], skip)
    assert not leaks, f"a token was written to a file: {leaks}"
