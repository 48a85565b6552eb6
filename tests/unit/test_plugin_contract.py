"""The plugin contract: plugins import core only through ``arctic_platform.rl.api``, core
names no plugin, and every transport and backend serves every operation of the table.

The import checks read the source with ``ast`` (nothing is imported); the serving checks
drive the real plugin objects (the http app and client, the ray actor class, the
dss-platform transport, app and service) over an in-process recording ``OperationHandler``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.servers import wait_listening

from arctic_platform.rl import api
from arctic_platform.rl.plugins import get_registry
from arctic_platform.rl.wire.operations import OPERATIONS

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "core" / "arctic_platform"
PLUGIN_ROOTS = (REPO / "plugins", REPO / "tests" / "example_plugin")
PUBLIC = "arctic_platform.rl.api"
# An application plugin (the demo) is a user of the library: it may import the user face too.
APPLICATIONS = (REPO / "plugins" / "demo",)
USER_FACE = ("arctic_platform.rl", "arctic_platform.rl.testing")
HEAVY = ("torch", "ray", "vllm", "deepspeed", "fastapi", "transformers", "uvicorn")
# Names in core that hold a plugin name chosen in the config (compared to a literal = a
# plugin fact known by name).
CONFIG_NAME_FIELDS = frozenset(
    {
        "backend",
        "comm_protocol",
        "transport",
        "engine",
        "training_engine",
        "sampling_engine",
        "log_prob_engine",
    }
)


def _sources(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _plugin_packages() -> set[str]:
    """Top-level packages of the built-in and example plugins (``arctic_rl_*``)."""
    return {
        init.parent.name
        for root in PLUGIN_ROOTS
        for init in root.glob("**/__init__.py")
        if init.parent.name.startswith("arctic_rl_") and init.parent.parent.name != "tests"
    }


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an import statement or a literal ``import_module(...)`` names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
                if isinstance(first.value, str):
                    found.append((node.lineno, first.value))
    return found


def _registered_names() -> set[str]:
    """Every backend, transport and engine name that the installed plugins register."""
    registry = get_registry()
    return {row["name"] for row in registry.rows() if row["kind"] != "loss"}


# --- (a) plugins import only the public module ---------------------------------------------


def _user_face(module: str) -> bool:
    """``arctic_platform.rl`` and its lazy names, ``arctic_platform.rl.testing`` and its names."""
    from arctic_platform import rl

    parent, _, name = module.rpartition(".")
    return module in USER_FACE or (
        parent in USER_FACE and (parent != USER_FACE[0] or name in rl.__all__)
    )


def test_plugins_import_nothing_of_core_but_the_api_module():
    offenders = []
    for path in _sources(*PLUGIN_ROOTS):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree):
            if not module.startswith("arctic_platform"):
                continue
            if module == PUBLIC or module.startswith(PUBLIC + "."):
                continue
            if any(path.is_relative_to(app) for app in APPLICATIONS) and _user_face(module):
                continue
            if module == "arctic_platform.rl" or module == "arctic_platform":
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
                continue
            offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, "plugins must import core only through arctic_platform.rl.api:\n" + (
        "\n".join(offenders)
    )


def test_the_import_check_sees_imports_inside_functions_and_type_checking_blocks():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from arctic_platform.rl.config import ArcticRLClientConfig\n"
        "def f():\n"
        "    import arctic_platform.rl.server.jobs\n"
        "    importlib.import_module('arctic_platform.rl.losses')\n"
        "    from arctic_platform.rl.api import RLServer\n"
    )
    modules = [m for _, m in _imported_modules(ast.parse(source))]
    assert "arctic_platform.rl.config" in modules
    assert "arctic_platform.rl.server.jobs" in modules
    assert "arctic_platform.rl.losses" in modules


def test_every_name_the_plugins_import_from_the_api_exists():
    missing = []
    for path in _sources(*PLUGIN_ROOTS):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == PUBLIC:
                missing += [
                    f"{path.relative_to(REPO)}: {a.name}"
                    for a in node.names
                    if a.name not in api.__all__
                ]
    assert not missing, missing


def test_every_name_of_the_api_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_importing_the_api_loads_no_heavy_library():
    program = (
        "import sys\n"
        "import arctic_platform.rl.api as api\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, ('import', loaded)\n"
        "assert 'arctic_platform.rl.server.rl_server' not in sys.modules\n"
        "[getattr(api, n) for n in api.__all__]\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, ('all names', loaded)\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)


# --- (b) core names no plugin --------------------------------------------------------------


def test_the_plugin_packages_are_found():
    assert {"arctic_rl_local", "arctic_rl_dss", "arctic_rl_http", "arctic_rl_ray"} <= (
        _plugin_packages()
    )
    assert {"arctic_rl_engines", "arctic_rl_tinker", "arctic_rl_example"} <= _plugin_packages()


def test_core_imports_no_plugin_package():
    packages = _plugin_packages()
    offenders = []
    for path in _sources(CORE):
        for line, module in _imported_modules(ast.parse(path.read_text())):
            if module.split(".")[0] in packages:
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, offenders


def _names_a_package(text: str, packages: set[str]) -> bool:
    for package in packages:
        start = text.find(package)
        while start >= 0:
            end = start + len(package)
            before = text[start - 1] if start else " "
            after = text[end] if end < len(text) else " "
            if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
                return True
            start = text.find(package, end)
    return False


def test_core_names_no_plugin_package_in_any_string():
    packages = _plugin_packages()
    offenders = []
    for path in _sources(CORE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _names_a_package(node.value, packages):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert not offenders, offenders


def _config_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in CONFIG_NAME_FIELDS:
        return node.attr
    if isinstance(node, ast.Name) and node.id in CONFIG_NAME_FIELDS:
        return node.id
    return None


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for e in node.elts for v in _literals(e)]
    return []


def test_core_compares_no_configured_plugin_name_to_a_literal():
    """A plugin fact (``backend == "local"``) belongs in the plugin's spec, not in core."""
    names = _registered_names()
    offenders = []
    for path in _sources(CORE):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            if not any(_config_name(o) for o in operands):
                continue
            hits = [v for o in operands for v in _literals(o) if v.lower() in names]
            if hits:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} compares to {hits}")
    assert not offenders, offenders


def test_the_plugin_facts_core_used_to_know_by_name_are_spec_fields():
    registry = get_registry()
    assert registry.get("backend", "local").needs_gpus is True
    assert registry.get("backend", "dss-platform").needs_gpus is False
    assert registry.get("engine", "vllm", role="sampling").max_concurrency > 4
    assert registry.get("engine", "deepspeed", role="training").max_concurrency == 4
    assert registry.get("engine", "deepspeed", role="training").hf_export_dir == "hf"


# --- (c) every transport and backend serves every operation --------------------------------
#
# The client side of every transport speaks the operations table; the server side serves an
# ``OperationHandler``. ``Recorder`` is such a handler that answers each operation with the
# smallest well-formed result and records the names it was asked for. ``tinker`` is not in
# these checks: it is a front-end (its client is the Tinker SDK and its routes are Tinker's
# API, which maps onto a part of the table); its spec builds no client of ours.

ALL = [op.name for op in OPERATIONS]
LAST = ("destroy", "shutdown")  # run after everything else: they end the jobs
ORDER = [name for name in ALL if name not in LAST] + list(LAST)
TOKEN = "contract-test-token-0123456789"
BATCH = {"input_ids": [[1, 2, 3, 4]], "advantages": [1.0]}


class Recorder:
    """An in-process ``OperationHandler``: records each call, answers like a small server."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.calls: list[str] = []
        self.shutdown_requested = threading.Event()
        self._jobs: dict[int, str] = {}
        self._checkpoints: dict[int, list[dict[str, Any]]] = {}

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        """Record ``name`` and answer with a minimal result of the shape RLServer gives."""
        self.calls.append(name)
        p = dict(payload or {})
        if name == "initialize":
            job_id = len(self._jobs)
            self._jobs[job_id] = "running"
            return {"job_id": job_id, "state": "pending"}
        if name in ("get_job", "destroy", "restart_job"):
            if name == "destroy":
                self._jobs[int(p["job_id"])] = "cancelled"
            job_id = int(p["job_id"])
            state = self._jobs.get(job_id, "running")
            saved = self._checkpoints.get(job_id, [])
            return {"job_id": job_id, "state": state, "weight_version": 0, "checkpoints": saved}
        if name == "shutdown":
            self.shutdown_requested.set()
            return {"status": "shutting down"}
        if name == "save_checkpoint":
            path = self.run_dir / "checkpoints" / str(p.get("tag") or "global_step1")
            path.mkdir(parents=True, exist_ok=True)
            self._checkpoints[int(p["job_id"])] = [{"step": 1, "path": str(path)}]
            return {"path": str(path), "global_step": 1}
        if name == "load_checkpoint":
            return {"global_step": 1, "path": str(p.get("path"))}
        if name == "weight_norm":
            return {"norms": {str(j): 1.0 for j in p["job_ids"]}}
        if name == "fwd_no_grad":
            return {"log_probs": [[0.0, -1.0, -1.0, -1.0]]}
        answers: dict[str, Any] = {
            "step": {"global_step": 1, "lr": 0.1, "grad_norm": 0.0, "applied": True},
            "fwd_bwd": {"loss": 0.5},
            "sync_weights": {"weight_version": 1, "jobs": {}},
        }
        return answers.get(name, {"ok": True, "operation": name})


def _payloads(ids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """A valid payload for every operation, for jobs ``ids`` (training, sampling, log_prob)."""
    t, s, lp = ids["training"], ids["sampling"], ids["log_prob"]
    return {
        "initialize": {"job_type": "training", "config": _job_config()},
        "get_job": {"job_id": t},
        "destroy": {"job_id": t},
        "restart_job": {"job_id": t},
        "fwd_bwd": {"job_id": t, "batch": BATCH, "loss_fn": "grpo", "request_id": "fb-1"},
        "fwd_no_grad": {"job_id": t, "batch": BATCH},
        "step": {"job_id": t, "request_id": "step-1"},
        "save_checkpoint": {"job_id": t, "tag": "contract"},
        "load_checkpoint": {"job_id": t},
        "empty_training_cache": {"job_id": t},
        "add_adapter": {"job_id": t, "adapter": "second", "seed": 3},
        "remove_adapter": {"job_id": s, "adapter": "second"},
        "generate": {"job_id": s, "prompts": ["1 + 1 ="], "sampling_params": {"max_tokens": 2}},
        "log_probs": {"job_id": lp, "prompts": [[1, 2]], "completions": [[3]]},
        "sync_weights": {"training_job_id": t, "sampling_job_ids": [s], "log_prob_job_ids": [lp]},
        "weight_norm": {"job_ids": [t, s]},
        "sleep_inference": {"job_id": s},
        "wake_inference": {"job_id": s},
        "sleep_training": {"job_id": t},
        "wake_training": {"job_id": t},
        "sleep_log_prob": {"job_id": lp},
        "wake_log_prob": {"job_id": lp},
        "reset_prefix_cache": {"job_id": s},
        "open_session": {"job_id": s, "ttl": 60.0},
        "list_sessions": {"job_id": s},
        "close_session": {"session_id": "ab12"},
        "session_trajectory": {"session_id": "ab12"},
    }


def _job_config() -> dict[str, Any]:
    return {"model_name": "m", "training_gpus": 1, "sampling_gpus": 1, "log_prob_gpus": 1}


def _initialize_all(transport: Any) -> dict[str, int]:
    ids = {}
    for job_type in ("sampling", "log_prob", "training"):
        answer = transport.call("initialize", {"job_type": job_type, "config": _job_config()})
        ids[job_type] = int(answer["job_id"])
    return ids


def test_local_backends_server_has_a_method_for_every_operation():
    server_cls = api.RLServer
    missing = [name for name in ALL if not callable(getattr(server_cls, name, None))]
    assert not missing, f"RLServer serves no {missing}"


def test_http_transport_serves_every_operation_end_to_end(tmp_path):
    """The registered http client and server: each call reaches the handler by its name."""
    spec = get_registry().get("transport", "http")
    serve, client_cls = spec.load_server(), spec.load()
    recorder = Recorder(tmp_path)
    port = api.free_port()
    thread = threading.Thread(
        target=serve, args=(recorder, "127.0.0.1", port, TOKEN), kwargs={"log_level": "warning"}
    )
    thread.start()
    transport = client_cls("127.0.0.1", port, TOKEN, retries=0)
    try:
        wait_listening(port, thread)
        ids = _initialize_all(transport)
        payloads = _payloads(ids)
        for name in ORDER:
            transport.call(name, payloads.get(name, {}))
            assert recorder.calls[-1] == name, (name, recorder.calls[-3:])
    finally:
        recorder.shutdown_requested.set()
        thread.join(timeout=30)
        transport.close()
    assert not thread.is_alive(), "the http server did not stop after shutdown"
    assert set(recorder.calls) == set(ALL)


def test_ray_transport_server_actor_hands_every_operation_to_the_server(tmp_path):
    """The actor class the ray transport hosts: its one method serves the whole table."""
    from arctic_rl_ray.server import RLServerActor

    spec = get_registry().get("transport", "ray")
    assert spec.load_server().__module__ == RLServerActor.__module__
    actor = RLServerActor.__new__(RLServerActor)  # no Ray, no RLServer: the recorder stands in
    actor.server = recorder = Recorder(tmp_path)
    payloads = _payloads({"training": 0, "sampling": 1, "log_prob": 2})
    for name in ORDER:
        actor.handle(name, payloads.get(name, {}))
        assert recorder.calls[-1] == name
    assert actor.shutdown_requested() is True


def test_every_transport_server_takes_the_arguments_its_protocol_promises():
    """``ServerTransport`` (host:port) or ``HostingServerTransport`` (run_dir), as the CLI calls."""
    import inspect

    hosting = {
        "num_gpus": 1,
        "ray_auto_attach": False,
        "ray_address": None,
        "op_timeout": 1.0,
        "sync_timeout": 1.0,
        "resume": False,
        "settings": {},
        "token": None,
    }
    specs = [r for r in get_registry().rows() if r["kind"] == "transport"]
    assert {r["name"] for r in specs} >= {"http", "ray", "tinker"}
    for row in specs:
        spec = get_registry().get("transport", row["name"])
        signature = inspect.signature(spec.load_server())
        if spec.network_address:
            signature.bind(object(), "127.0.0.1", 1, "token")
        else:
            signature.bind(Path("run"), **hosting)


def test_tinker_is_a_front_end_without_a_client_of_ours():
    spec = get_registry().get("transport", "tinker")
    assert spec.server_factory is not None
    with pytest.raises(api.ArcticRLError):
        spec.create("127.0.0.1", 8000, "tml-token")


# Agent sessions (issue 26) are served by the local server's http transport; the platform
# does not offer them yet.
DSS_NOT_YET = frozenset({"open_session", "list_sessions", "close_session", "session_trajectory"})


def test_dss_platform_serves_every_operation_through_the_platform(tmp_path):
    """DssTransport → the platform app → PlatformService → the core operation, for each row."""
    import uvicorn

    from arctic_rl_dss.app import build_app
    from arctic_rl_dss.service import PlatformService
    from arctic_rl_dss.store import Store
    from arctic_rl_dss.transport import DssTransport, PollSettings
    from arctic_rl_dss.users import Users

    assert get_registry().get("backend", "dss-platform").load().__name__ == "DssPlatformBackend"
    recorder = Recorder(tmp_path)
    service = PlatformService(
        recorder, Store(tmp_path / "p.sqlite3"), Users.from_data({"a": TOKEN})
    )
    sock = api.listening_socket("127.0.0.1", 0, 64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(service), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll = PollSettings(initial=0.01, factor=1.5, maximum=0.1, timeout=60)
    transports: list[DssTransport] = []

    def transport() -> DssTransport:
        transports.append(DssTransport("127.0.0.1", port, TOKEN, poll=poll, retries=0))
        return transports[-1]

    # platform-side operations (no core call of their own; a later initialize answers the id
    # of the platform job's sub-job), and shutdown's core call
    own = {"health": None, "status": None, "metrics": None, "initialize": None}
    own["shutdown"] = "destroy"
    try:
        wait_listening(port, thread)
        first = transport()
        ids = _initialize_all(first)
        payloads = _payloads(ids)
        served = {"initialize"}
        for name in [n for n in ORDER if n != "shutdown"]:
            before = len(recorder.calls)
            if name in DSS_NOT_YET:  # refused by name, before anything is sent
                with pytest.raises(api.TransportError, match="not offered"):
                    first.call(name, payloads.get(name, {}))
                served.add(name)
                continue
            first.call(name, payloads.get(name, {}))
            expected = own.get(name, name)
            if expected is not None:
                assert expected in recorder.calls[before:], (name, recorder.calls[before:])
            served.add(name)
        metrics = first.call("metrics")  # the caller's own records, after all of the above
        assert metrics["requests"]["forward-backward"] == 1, metrics
        assert metrics["errors"] == {}, metrics
        assert metrics["jobs_by_state"] == {"cancelled": 3}, metrics
        second = transport()  # shutdown ends the platform jobs this client holds
        _initialize_all(second)
        before = len(recorder.calls)
        assert second.call("shutdown")["status"] == "shutting down"
        assert recorder.calls[before:].count("destroy") == 3
        served.add("shutdown")
    finally:
        for t in transports:
            t.close()
        server.should_exit = True
        thread.join(timeout=30)
        service.close()
        sock.close()
    assert served == set(ALL)
