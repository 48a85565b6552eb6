"""The ``local`` backend: attach to the Arctic RL server at host:port, or launch one.

A launched server is a detached ``arctic-rl serve`` process that outlives this client, so
another process can reconnect; its token, log and job table live in the server's run
directory. When a client that reconnects to job ids finds there the job table of a server
that died, the new server is started with ``--resume`` and brings those jobs back with the
same ids.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import (
    ArcticRLClientConfig,
    ArcticRLError,
    Backend,
    ClientTransport,
    ServeError,
    ServerError,
    get_registry,
    read_or_create_token,
    server_run_dir,
    state_path,
)

logger = logging.getLogger(__name__)


class ServerStartError(ServeError):
    """The local server did not become healthy."""

    remedy = "Read the server log tail in the message; fix what it names and start again."


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs; an exited child of ours (a zombie) is reaped and is not."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child: its parent reaps it
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _LogFollower(threading.Thread):
    """Copies new lines of the server log to this process's stderr (from the start of a new
    file after the server rotated it)."""

    def __init__(self, path: Path, offset: int) -> None:
        super().__init__(daemon=True, name="server-log")
        self.path, self.offset = path, offset
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.3):
            try:
                with self.path.open("rb") as f:
                    if os.fstat(f.fileno()).st_size < self.offset:  # rotated
                        self.offset = 0
                    f.seek(self.offset)
                    chunk = f.read()
            except OSError:
                continue
            if chunk:
                self.offset += len(chunk)
                for line in chunk.decode(errors="replace").splitlines():
                    sys.stderr.write(f"[arctic-rl server] {line}\n")


class LocalBackend(Backend):
    """Runs (or reuses) an ``arctic-rl serve`` process and a Ray cluster on this node."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.transport: ClientTransport | None = None
        self.run_dir: Path | None = None
        self.follower: _LogFollower | None = None

    def _connect(self, config: ArcticRLClientConfig, token: str) -> Any:
        spec = get_registry().get("transport", config.comm_protocol)
        if not spec.network_address:  # a cluster-hosted server found through the run dir
            return spec.create(self.run_dir)
        return spec.create(config.host, config.port, token)

    def start(self, config: ArcticRLClientConfig) -> ClientTransport:
        """Attach to a healthy server that accepts our token, else launch one and wait for it."""
        self.run_dir = server_run_dir(config.host, config.port, config.comm_protocol)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        token = read_or_create_token(self.run_dir / "token")
        transport = self._connect(config, token)
        if self._answers(transport):
            try:
                transport.call("status")
            except ServerError as exc:
                transport.close()
                if exc.status_code == 401:
                    raise ArcticRLError(
                        f"a server answers at {config.host}:{config.port} but refuses the token "
                        f"in {self.run_dir / 'token'}; it was not started by this machine's local "
                        "backend (choose another port, or stop that server)"
                    ) from None
                raise
            logger.info("attached to the Arctic RL server at %s:%s", config.host, config.port)
            self.transport = transport
            return transport
        self._launch(config)
        self._wait_healthy(config, transport)
        self.transport = transport
        return transport

    def _answers(self, transport: Any) -> bool:
        """Whether a server already answers (a stale run dir of a dead server does not)."""
        pid = self._server_pid()
        if pid is not None and not _pid_alive(pid) and not self._network(transport):
            return False
        return bool(transport.health())

    @staticmethod
    def _network(transport: Any) -> bool:
        return hasattr(transport, "base_url")

    def _launch(self, config: ArcticRLClientConfig) -> None:
        assert self.run_dir is not None
        counts = (config.training_gpus, config.sampling_gpus, config.log_prob_gpus)
        num_gpus = max(counts) if config.colocate else sum(counts)
        log_path = self.run_dir / "server.log"
        cmd = [
            sys.executable,
            "-m",
            "arctic_platform.rl.cli",
            "serve",
            "--host",
            str(config.host or "127.0.0.1"),
            "--port",
            str(config.port or 0),
            "--transport",
            config.comm_protocol,
            "--token-file",
            str(self.run_dir / "token"),
            "--run-dir",
            str(self.run_dir),
            "--num-gpus",
            str(max(num_gpus, 1)),
            "--log-file",
            str(log_path),
        ]
        if not config.ray_auto_attach:
            cmd.append("--no-ray-auto-attach")
        if config.reconnect_mode and state_path(self.run_dir).exists():
            # a client of jobs whose server died: bring them back (a new run starts without
            # them: they would hold GPUs its jobs need; they stay restartable)
            cmd += ["--resume", str(self.run_dir)]
            logger.info("resuming the jobs of the earlier server in %s", self.run_dir)
        offset = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=dict(os.environ),
            )
        logger.info("launched arctic-rl serve (pid %d), log: %s", self.process.pid, log_path)
        if config.server_logs:
            self.follower = _LogFollower(log_path, offset)
            self.follower.start()

    def _wait_healthy(self, config: ArcticRLClientConfig, transport: Any) -> None:
        assert self.process is not None and self.run_dir is not None
        from tqdm import tqdm

        started = time.monotonic()
        where = f"{config.host}:{config.port}" if config.host else config.comm_protocol
        bar = tqdm(
            total=None,
            desc=f"arctic-rl server {where}: starting",
            bar_format="{desc} [{elapsed}]",
            file=sys.stderr,
        )
        try:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"arctic-rl serve exited with code {code} before becoming healthy; "
                        f"last lines of {self.run_dir / 'server.log'}:\n"
                        f"{_tail(self.run_dir / 'server.log')}"
                    )
                if transport.health():
                    bar.set_description_str(f"arctic-rl server {where}: healthy")
                    return
                if time.monotonic() - started > config.startup_timeout:
                    self._terminate()
                    raise ServerStartError(
                        f"the server at {config.host}:{config.port} was not healthy within "
                        f"startup_timeout={config.startup_timeout}s; last log lines:\n"
                        f"{_tail(self.run_dir / 'server.log')}"
                    )
                time.sleep(config.health_check_interval)
        finally:
            bar.close()

    def _server_pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid
        if self.run_dir is not None and (self.run_dir / "server.pid").exists():
            try:
                return int((self.run_dir / "server.pid").read_text().strip())
            except ValueError:
                return None
        return None

    def _terminate(self, grace: float = 60.0) -> None:
        pid = self._server_pid()
        if pid is None:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.process is not None:
                if self.process.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.2)
        logger.warning(
            "server pid %d did not exit in %.0fs; terminating its process group", pid, grace
        )
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            time.sleep(5)

    def stop(self) -> None:
        """Ask the server to shut down (jobs, Ray cluster it started) and wait for it to exit."""
        if self.transport is not None:
            try:
                self.transport.call("shutdown")
            except Exception as exc:
                logger.warning("shutdown request failed: %s", exc)
            # Leave before the server's cluster goes: a Ray driver still connected to a
            # cluster that stops is ended by Ray (the caller's process, without a word).
            self.transport.close()
        self._terminate()
        if self.follower is not None:
            time.sleep(0.5)
            self.follower.stopped.set()
