"""The namespace cluster harness itself: nodes on their own addresses, kill, clean-up."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest
from netns_cluster import ClusterStartError, NetnsCluster, netns_pids, pid_gone

# a driver in the head's namespace: one num_gpus=1 actor pinned to each worker node
PLACE_ACTORS = r"""
import json, sys
import ray
import ray._private.state

ray.init()  # RAY_ADDRESS and the token come from the cluster's env
workers = json.loads(sys.argv[1])

@ray.remote(num_gpus=1, num_cpus=0)
class Where:
    def ip(self):
        return ray.util.get_node_ip_address()

actors = [Where.options(resources={f"node:{ip}": 0.001}).remote() for ip in workers]
ips = ray.get([a.ip.remote() for a in actors], timeout=300)
table = [
    {"class": a.get("ActorClassName"), "ip": a.get("Address", {}).get("IPAddress"),
     "state": a.get("State")}
    for a in ray._private.state.actors().values()
]
nodes = [
    {"ip": n["NodeManagerAddress"], "alive": n["Alive"], "gpus": n["Resources"].get("GPU", 0)}
    for n in ray.nodes()
]
print("RESULT " + json.dumps({"ips": ips, "actors": table, "nodes": nodes}))
"""


def _result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in:\n{out[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def test_actors_land_on_their_worker_nodes(netns_cluster: NetnsCluster) -> None:
    """A driver in the head's namespace sees every node alive, the head without GPUs, and a
    one-GPU actor on each worker reports that worker's 198.18.0.0/15 address."""
    cluster = netns_cluster
    workers = [h.ip for h in cluster.worker_hosts]
    done = cluster.exec_python(cluster.head, PLACE_ACTORS, args=[json.dumps(workers)])
    assert done.returncode == 0, done.stderr[-3000:]
    got = _result(done.stdout)
    alive = {n["ip"]: n["gpus"] for n in got["nodes"] if n["alive"]}
    assert alive == {cluster.head.ip: 0, **dict.fromkeys(workers, 1)}
    assert got["ips"] == workers
    assert all(ip.startswith(("198.18.", "198.19.")) for ip in got["ips"])
    placed = sorted(a["ip"] for a in got["actors"] if a["class"] == "Where")
    assert placed == sorted(workers)
    assert {a["state"] for a in got["actors"] if a["class"] == "Where"} <= {"ALIVE", "DEAD"}


def test_client_namespace_reaches_head_but_runs_no_ray(netns_cluster: NetnsCluster) -> None:
    """A client host has its own address, reaches the head's GCS port, and holds no Ray."""
    client = netns_cluster.client_hosts[0]
    assert netns_cluster.pids(client) == []
    probe = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\n"
        "print('RESULT ' + '{\"local\": \"%s\"}' % s.getsockname()[0])\n"
    )
    host, port = netns_cluster.head_address.split(":")
    done = netns_cluster.exec_python(client, probe, args=[host, port], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _result(done.stdout)["local"] == client.ip


CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("RESULT {\"connected\": true}")
except OSError as exc:
    print("RESULT {\"connected\": false}")
    print(exc, file=sys.stderr)
"""


def test_link_down_cuts_a_host_off(netns_cluster: NetnsCluster) -> None:
    """``link_down`` cuts a host off from the others; ``link_up`` reconnects it."""
    client = netns_cluster.client_hosts[0]
    host, port = netns_cluster.head_address.split(":")

    def connected() -> bool:
        done = netns_cluster.exec_python(client, CONNECT, args=[host, port, "5"], timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return bool(_result(done.stdout)["connected"])

    netns_cluster.link_down(client)
    try:
        assert not connected()
    finally:
        netns_cluster.link_up(client)
    deadline = time.monotonic() + 120
    while not connected():  # the link takes a moment to carry traffic again
        assert time.monotonic() < deadline, "no connection 120 s after link_up"
        time.sleep(1)


def test_close_removes_everything(netns_cluster_factory: Callable[..., NetnsCluster]) -> None:
    """``close`` ends every process in the run's namespaces (Ray's and a test's own, with
    their children) and deletes the namespaces, veth pairs and the bridge."""
    cluster = netns_cluster_factory(workers=0, clients=1)  # Ray on the head only
    client = cluster.client_hosts[0]
    stray = cluster.run_in(client, ["sh", "-c", "sleep 600 & sleep 600"])
    # `ip netns exec` enters the namespace a moment after it starts (seen missing once in CI)
    deadline = time.monotonic() + 30
    while True:
        pids = {p for ns in cluster.namespaces for p in netns_pids(ns)}
        if (stray.pid in pids and len(pids) > 2) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stray.pid in pids and len(pids) > 2
    assert cluster.leftovers()  # all there before close
    cluster.close()
    assert cluster.leftovers() == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in names for ns in cluster.namespaces)
    still = sorted(p for p in pids | cluster.seen_pids if not pid_gone(p))
    assert still == []
    cluster.close()  # a second close is harmless


def test_failed_start_cleans_up(netns_available: None) -> None:
    """A start that fails halfway names the node that did not come up and leaves nothing."""
    cluster = NetnsCluster(workers=1, start_timeout=0.5)
    with pytest.raises(ClusterStartError, match=r"h\d .*did not come up"):
        cluster.start()
    assert cluster.leftovers() == []
    assert all(pid_gone(p) for p in cluster.seen_pids)
