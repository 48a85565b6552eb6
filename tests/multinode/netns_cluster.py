"""A multi-node Ray cluster on one machine: one Linux network namespace per "host".

Each host is a network namespace (``arl-<pid>-<tag>-h<k>``) with loopback up and one
interface ``eth0`` (a veth pair whose other end is on a bridge this run creates), an address
in a /24 of 198.18.0.0/15 chosen per run, and a default route on ``eth0`` as a real host has.
Host 0 runs the Ray head (no GPUs), hosts 1..N one Ray worker each (logical GPUs), and any
"client" hosts run no Ray at all. Every Ray process shares one token (``RAY_AUTH_MODE=token``).

Clean-up ends every process inside each namespace this run made, by the PIDs that
``ip netns pids`` lists (SIGTERM, a short wait, SIGKILL, until none are left), then deletes the
veth pairs, the namespaces and the bridge. Nothing is killed by name and nothing this run did
not create is touched. ``close`` is idempotent and also registered with ``atexit``.

Needs root and iproute2; ``unavailable_reason()`` says why a machine cannot.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SUPERNET_FIRST_OCTETS = (18, 19)  # 198.18.0.0/15: 512 /24 subnets
RAY_PORT = 6379
IFNAME = "eth0"
_LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

Role = Literal["head", "worker", "client"]


class ClusterStartError(RuntimeError):
    """A namespace, link or Ray node of the cluster could not be brought up."""


@dataclass(frozen=True)
class Host:
    """One "host": its namespace, address, role and the host-side end of its veth pair."""

    index: int
    role: Role
    namespace: str
    ip: str
    host_veth: str
    ifname: str = IFNAME


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise ``ClusterStartError`` with its stderr if ``check`` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise ClusterStartError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why this machine cannot host a namespace cluster (None when it can)."""
    if os.geteuid() != 0:
        return "multi-node tests need root (network namespaces, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "multi-node tests need iproute2's `ip` command"
    probe = f"arl-{os.getpid()}-probe{secrets.token_hex(2)}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` fails here: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def netns_pids(namespace: str) -> list[int]:
    """PIDs of the processes inside ``namespace`` (``ip netns pids``); [] if it is gone."""
    done = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split() if p.strip().isdigit()]


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_READY_PROBE = r"""
import json, os, sys, time
import ray
address, out = sys.argv[1], sys.argv[2]

def report(**state):
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, out)

while True:
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        break
    except Exception as exc:  # the head is not up yet
        report(alive=[], error=f"{type(exc).__name__}: {exc}"[:500])
        time.sleep(1.0)
while True:
    report(alive=sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]))
    time.sleep(0.5)
"""


@dataclass
class NetnsCluster:
    """A Ray cluster of ``workers`` one-GPU nodes plus a GPU-less head, each in its own netns.

    Use ``start()`` (or the ``netns_cluster`` fixture), then ``run_in`` / ``exec_python`` to run
    drivers, servers or clients inside a host, and ``close()`` to remove everything.
    """

    workers: int = 2
    clients: int = 0
    gpus_per_worker: int = 1
    cpus_per_node: int = 4
    object_store_bytes: int = 256 * 1024 * 1024
    start_timeout: float = 420.0
    python: str = sys.executable
    extra_env: Mapping[str, str] = field(default_factory=dict)
    keep_run_dir: bool = bool(os.environ.get("ARL_NETNS_KEEP"))
    ray: bool = True  # False: only the namespaces and links (hosts run what a test starts)
    hosts: list[Host] = field(default_factory=list, init=False)
    run_dir: Path = field(default=Path(), init=False)
    token_path: Path = field(default=Path(), init=False)
    env: dict[str, str] = field(default_factory=dict, init=False)
    bridge: str = field(default="", init=False)
    subnet: str = field(default="", init=False)
    started_seconds: float = field(default=0.0, init=False)
    _tag: str = field(default="", init=False)
    _lock_fd: int | None = field(default=None, init=False)
    _bridge_made: bool = field(default=False, init=False)
    _made_links: list[str] = field(default_factory=list, init=False)
    _made_ns: list[str] = field(default_factory=list, init=False)
    _ray_procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, init=False)
    _seen_pids: set[int] = field(default_factory=set, init=False)
    _closed: bool = field(default=False, init=False)

    # --- addresses and names ------------------------------------------------------------

    @property
    def head(self) -> Host:
        """The head host (index 0): GCS, a raylet with no GPUs."""
        return self.hosts[0]

    @property
    def worker_hosts(self) -> list[Host]:
        """The worker hosts (indices 1..workers), one logical-GPU raylet each."""
        return [h for h in self.hosts if h.role == "worker"]

    @property
    def client_hosts(self) -> list[Host]:
        """Hosts with no Ray process: for clients that reach the cluster over the bridge."""
        return [h for h in self.hosts if h.role == "client"]

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the run, head first."""
        return [h.namespace for h in self.hosts]

    @property
    def node_ips(self) -> list[str]:
        """The address of every host, head first."""
        return [h.ip for h in self.hosts]

    @property
    def head_address(self) -> str:
        """``ip:port`` of the head's GCS, for ``ray.init(address=...)`` and ``RAY_ADDRESS``."""
        return f"{self.head.ip}:{RAY_PORT}"

    def host(self, which: int | str | Host) -> Host:
        """A host by index, namespace name or address."""
        if isinstance(which, Host):
            return which
        for h in self.hosts:
            if which in (h.index, h.namespace, h.ip):
                return h
        raise KeyError(f"no host {which!r} in this cluster ({self.namespaces})")

    def driver_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The cluster env plus ``RAY_ADDRESS`` (for drivers, servers, clients)."""
        return {**self.env, "RAY_ADDRESS": self.head_address, **(extra or {})}

    # --- start --------------------------------------------------------------------------

    def start(self) -> NetnsCluster:
        """Create the bridge, namespaces and links, start Ray in each, wait for all nodes.

        On any failure everything made so far is removed before the error propagates.
        """
        atexit.register(self.close)
        started = time.monotonic()
        try:
            self._make_network()
            self._start_ray()
        except BaseException:
            self.close()
            raise
        self.started_seconds = time.monotonic() - started
        return self

    def _reserve_subnet(self) -> int:
        """Lock one of the 512 /24s for this run (an flock, released on close or exit)."""
        _LOCK_DIR.mkdir(parents=True, exist_ok=True)
        choices = list(range(512))
        random.shuffle(choices)
        for index in choices:
            fd = os.open(
                _LOCK_DIR / f"arl-netns-subnet-{index}.lock", os.O_CREAT | os.O_RDWR, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._lock_fd = fd
            return index
        raise ClusterStartError("all 512 /24 subnets of 198.18.0.0/15 are held by other runs")

    def _make_network(self) -> None:
        self._tag = secrets.token_hex(3)
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"arl-{self._tag}-", dir="/tmp"))
        index = self._reserve_subnet()
        prefix = f"198.{SUPERNET_FIRST_OCTETS[index // 256]}.{index % 256}"
        self.subnet = f"{prefix}.0/24"
        worker: Role = "worker"
        client: Role = "client"
        roles: list[Role] = ["head", *[worker] * self.workers, *[client] * self.clients]
        self.bridge = f"arlbr{self._tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("link", "set", self.bridge, "up")
        for k, role in enumerate(roles):
            host = Host(
                index=k,
                role=role,
                namespace=f"arl-{os.getpid()}-{self._tag}-h{k}",
                ip=f"{prefix}.{k + 1}",
                host_veth=f"arl{self._tag}h{k}",
            )
            peer = f"arl{self._tag}n{k}"
            _ip("netns", "add", host.namespace)
            self._made_ns.append(host.namespace)
            _ip("link", "add", host.host_veth, "type", "veth", "peer", "name", peer)
            self._made_links.append(host.host_veth)
            _ip("link", "set", peer, "netns", host.namespace)
            _ip("-n", host.namespace, "link", "set", peer, "name", IFNAME)
            _ip("link", "set", host.host_veth, "master", self.bridge)
            _ip("link", "set", host.host_veth, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", IFNAME)
            _ip("-n", host.namespace, "link", "set", IFNAME, "up")
            _ip("-n", host.namespace, "route", "add", "default", "dev", IFNAME)
            self.hosts.append(host)

    def _base_env(self) -> dict[str, str]:
        # nothing of the calling process's own Ray set-up (address, loopback switch, token)
        env = {
            k: v
            for k, v in os.environ.items()
            if k.lower() not in _PROXY_VARS and not k.startswith("RAY_")
        }
        venv_bin = str(Path(self.python).parent)
        env.update(
            PATH=f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_path),
            RAY_USAGE_STATS_ENABLED="0",
            # no idle workers started ahead of need: on a 2-core machine they slow start-up
            RAY_enable_worker_prestart="0",
            RAY_prestart_worker_first_driver="0",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        env.update(self.extra_env)
        return env

    def _start_ray(self) -> None:
        self.token_path = self.run_dir / "ray-token"
        fd = os.open(self.token_path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        self.env = self._base_env()
        (self.run_dir / "logs").mkdir()
        if not self.ray:
            return
        self._start_node(self.head)
        self._wait_alive()

    def _ray_argv(self, host: Host) -> list[str]:
        """``ray start --block`` for one host: the head without GPUs, workers with them."""
        common = [
            "--block",
            f"--node-ip-address={host.ip}",
            f"--num-cpus={self.cpus_per_node}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={self.run_dir / 'ray'}",
            "--disable-usage-stats",
        ]
        ray = str(Path(self.python).parent / "ray")
        if host.role == "head":
            return [
                ray,
                "start",
                "--head",
                f"--port={RAY_PORT}",
                "--num-gpus=0",
                "--include-dashboard=false",
                *common,
            ]
        return [
            ray,
            "start",
            f"--address={self.head_address}",
            f"--num-gpus={self.gpus_per_worker}",
            *common,
        ]

    def _start_node(self, host: Host) -> None:
        log = open(self.log_path(host), "ab")
        try:
            proc = self._popen(
                host, self._ray_argv(host), self.env, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        self._ray_procs[host.index] = proc

    def log_path(self, which: int | str | Host) -> Path:
        """The file that holds a host's ``ray start --block`` output."""
        return self.run_dir / "logs" / f"h{self.host(which).index}-ray-start.log"

    def _start_probe(self, status: Path) -> subprocess.Popen[Any]:
        """A driver in the head's namespace that keeps writing the alive nodes to ``status``."""
        status.unlink(missing_ok=True)
        with open(self.run_dir / "logs" / "ready-probe.log", "ab") as log:
            return self._popen(
                self.head,
                [self.python, "-c", _READY_PROBE, self.head_address, str(status)],
                self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_alive(self, attempts: int = 4, in_flight: int = 2) -> None:
        """Wait until every Ray host is alive in ``ray.nodes()``, starting workers once the
        head is alive, at most ``in_flight`` at a time (a loaded 2-core machine starts two
        faster than four). Ray gives a raylet only 30 s to register before ``ray start``
        gives up, too short under load: such a node is started again, up to ``attempts``
        times in all, within ``start_timeout``. The error names the node that never came up.
        """
        status = self.run_dir / "ready.json"
        probe = self._start_probe(status)
        want = {h.ip for h in self.hosts if h.role != "client"}
        tries = {self.head.ip: 1}
        deadline = time.monotonic() + self.start_timeout
        state: dict[str, Any] = {}
        try:
            while True:
                with contextlib.suppress(OSError, ValueError):
                    state = json.loads(status.read_text())
                alive = set(state.get("alive", []))
                if want <= alive:
                    return
                if self.head.ip in alive:
                    starting = [h for h in self.worker_hosts if h.ip in tries and h.ip not in alive]
                    for host in self.worker_hosts:
                        if len(starting) >= in_flight:
                            break
                        if host.ip not in tries:
                            self._start_node(host)
                            tries[host.ip] = 1
                            starting.append(host)
                for k, proc in list(self._ray_procs.items()):
                    if proc.poll() is None:
                        continue
                    host = self.hosts[k]
                    if tries[host.ip] >= attempts or (host.role == "head" and len(tries) > 1):
                        self._raise_node(k, f"`ray start` exited with {proc.returncode}")
                    self._end_namespace(host.namespace, grace=1.0, timeout=30.0)
                    with open(self.log_path(host), "ab") as log:
                        log.write(b"\n--- harness: ray start gave up; starting it again ---\n")
                    tries[host.ip] += 1
                    self._start_node(host)
                    if host.role == "head":  # the probe ran in the head's namespace too
                        probe = self._start_probe(status)
                if probe.poll() is not None:
                    raise ClusterStartError(
                        f"the readiness probe in {self.head.namespace} exited with "
                        f"{probe.returncode}:\n{_tail(self.run_dir / 'logs' / 'ready-probe.log')}"
                    )
                if time.monotonic() > deadline:
                    missing = sorted(want - alive, key=lambda ip: self.host(ip).index)
                    first = self.host(missing[0])
                    detail = f" (probe: {state['error']})" if state.get("error") else ""
                    self._raise_node(
                        first.index,
                        f"not alive after {self.start_timeout:.0f}s (attempts: {tries}); "
                        f"alive: {sorted(alive)}, missing: {missing}{detail}",
                    )
                time.sleep(0.25)
        finally:
            probe.kill()
            probe.wait(timeout=30)

    def _raise_node(self, k: int, why: str) -> None:
        host = self.hosts[k]
        raise ClusterStartError(
            f"Ray {host.role} node h{k} ({host.namespace}, {host.ip}) did not come up: {why}\n"
            f"--- tail of {self.log_path(host)} ---\n{_tail(self.log_path(host))}"
        )

    # --- running things inside a host ---------------------------------------------------

    def _popen(
        self, host: Host, argv: Sequence[str], env: Mapping[str, str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, *argv], env=dict(env), **kwargs
        )
        self._procs.append(proc)
        self._seen_pids.add(proc.pid)
        return proc

    def run_in(
        self,
        which: int | str | Host,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside a host's namespace (``ip netns exec``); returns the Popen.

        ``env`` defaults to ``driver_env()`` (the token env plus ``RAY_ADDRESS``); the process
        and its children are ended by ``close()`` like every process in the namespace.
        """
        return self._popen(self.host(which), argv, env or self.driver_env(), **popen_kwargs)

    def exec_python(
        self,
        which: int | str | Host,
        code_or_script: str | Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run Python code (a ``str``) or a script (a ``Path``) in a host; wait for it.

        Returns the completed process with text stdout/stderr; on timeout the process is
        killed and ``subprocess.TimeoutExpired`` propagates.
        """
        what = [str(code_or_script)] if isinstance(code_or_script, Path) else ["-c", code_or_script]
        proc = self.run_in(
            which,
            [self.python, *what, *args],
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # --- faults -------------------------------------------------------------------------

    def pids(self, which: int | str | Host) -> list[int]:
        """The PIDs now inside a host's namespace."""
        return netns_pids(self.host(which).namespace)

    def kill_node(self, which: int | str | Host, timeout: float = 60.0) -> list[int]:
        """SIGKILL every process in a host's namespace (until none is left); returns PIDs."""
        host = self.host(which)
        killed = self._end_namespace(host.namespace, grace=0.0, timeout=timeout)
        self._reap()
        return killed

    def link_down(self, which: int | str | Host) -> None:
        """Cut a host off: set the host-side end of its veth pair down."""
        _ip("link", "set", self.host(which).host_veth, "down")

    def link_up(self, which: int | str | Host) -> None:
        """Reconnect a host cut off by ``link_down``."""
        _ip("link", "set", self.host(which).host_veth, "up")

    # --- clean-up -----------------------------------------------------------------------

    def _end_namespace(self, namespace: str, grace: float, timeout: float) -> list[int]:
        """End every process in ``namespace`` by PID: SIGTERM, up to ``grace`` s, then SIGKILL
        whatever the namespace still lists, until it lists nothing (zombies count as ended)."""
        ended: list[int] = []
        deadline = time.monotonic() + timeout
        term_sent = grace <= 0
        while True:
            pids = [p for p in netns_pids(namespace) if p != os.getpid() and not pid_gone(p)]
            if not pids:
                return ended
            ended.extend(p for p in pids if p not in ended)
            self._seen_pids.update(pids)
            sig = signal.SIGKILL if term_sent else signal.SIGTERM
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if not term_sent:
                term_sent = True
                wait_until = time.monotonic() + grace
                while time.monotonic() < wait_until and not all(map(pid_gone, pids)):
                    time.sleep(0.1)
            self._reap()
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {pids} in {namespace} survived SIGKILL")
            time.sleep(0.05)

    def _reap(self) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5 if pid_gone(proc.pid) else 0.01)

    @property
    def seen_pids(self) -> set[int]:
        """Every PID this run started or found in its namespaces."""
        return set(self._seen_pids)

    def close(self) -> None:
        """End every process in the run's namespaces, then delete links, namespaces, bridge.

        Safe to call twice, after a failed ``start`` and from ``atexit``; errors on one
        namespace do not stop the clean-up of the others (the first one is raised at the end).
        """
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for namespace in self._made_ns:
            try:
                self._end_namespace(namespace, grace=3.0, timeout=60.0)
            except Exception as exc:  # keep cleaning up the rest
                errors.append(exc)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                if proc.returncode is None:
                    proc.kill()
                proc.wait(timeout=5)
        for link in self._made_links:
            _ip("link", "del", link, check=False)
        for namespace in self._made_ns:
            if netns_pids(namespace):
                continue  # still holds processes (already reported): deleting would orphan them
            _ip("netns", "del", namespace, check=False)
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.run_dir != Path() and self.run_dir.is_dir() and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        atexit.unregister(self.close)
        if errors:
            raise errors[0]

    def leftovers(self) -> list[str]:
        """Namespaces, links and the bridge of this run that still exist (for tests)."""
        names = set(_ip("netns", "list", check=False).stdout.split())
        left = [ns for ns in self._made_ns if ns in names]
        links = _ip("-o", "link", "show", check=False).stdout
        for link in [*self._made_links, self.bridge]:
            if link and (f" {link}:" in links or f" {link}@" in links):
                left.append(link)
        return left

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
