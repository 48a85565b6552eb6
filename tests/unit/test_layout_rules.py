"""The folder rules of core (``core/arctic_platform/rl``), each a check of the source with
``ast`` (nothing is imported): no import cycle, no file over 600 lines, and which folder may
import which. A failure names the file, the line and the import that breaks the rule.

Layers, from the ground up: the ground floor (errors, network, run_dirs, lazy_names) imports
nothing of ``arctic_platform.rl``; ``weight_sync/`` only the ground floor and ``config``;
``wire/`` is data and codecs; ``agents/`` (agent sessions' pure core) only the ground floor,
``config``, ``wire`` and ``batch``; ``server/`` is transport-free and reads top-down (rl_server ->
weight_sync_ops -> jobs -> the modules below it); ``web/`` is the only HTTP code.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "core" / "arctic_platform" / "rl"
PLUGINS = REPO / "plugins"
RL = "arctic_platform.rl"
MAX_LINES = 600
GROUND_FLOOR = ("errors", "network", "run_dirs", "lazy_names")
HTTP_LIBRARIES = ("fastapi", "starlette", "uvicorn", "httpx")
# web/ is the only core code that imports the HTTP libraries; http_common.py is its deprecated
# old home (now an alias of web/common.py that imports none of them): no layer below may import
# either, and the alias may not take up the HTTP libraries again
WEB = ("web", "http_common")
# server modules at or above jobs.py (the manager and what drives it); every other server
# module is below jobs.py and reads the live job record from job_state.py instead
SERVER_ABOVE_JOBS = ("__init__", "jobs", "weight_sync_ops", "rl_server", "process")
# agents/ is a layer of its own: no server, web or client code below it, only these
AGENTS_MAY_IMPORT = (*GROUND_FLOOR, "config", "wire", "batch", "agents")


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is, and whether only type checkers see it."""

    source: Path
    line: int
    target: str
    type_only: bool

    def where(self) -> str:
        return f"{self.source.relative_to(REPO)}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([RL, *parts])


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@cache
def _core_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _sources(CORE)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def _lazy_names(module: str) -> dict[str, str]:
    """The names a core module re-exports lazily (its ``_LAZY = {name: module}`` literal)."""
    path = _core_modules().get(module)
    if path is None:
        return {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value: v.value
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


@cache
def _imports(path: Path) -> tuple[Import, ...]:
    """Every import in ``path`` (see ``_imports_in``)."""
    return _imports_in(path, path.read_text())


def _imports_in(path: Path, text: str) -> tuple[Import, ...]:
    """Every import in ``text`` (the source of ``path``), module-level and inside functions
    alike; ``from X import Y`` counts as an import of ``X.Y`` when that is a core module, of
    the module ``Y`` comes from when ``X`` re-exports it lazily (``arctic_platform.rl``'s
    client, ``api``'s server names), else of ``X``."""
    tree = ast.parse(text, filename=str(path))
    found: list[Import] = []
    modules = _core_modules()

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(path, node.lineno, alias.name, type_only))
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(path, node)
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                lazy = _lazy_names(module).get(alias.name)
                target = submodule if submodule in modules else lazy or module
                found.append(Import(path, node.lineno, target, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return tuple(found)


def _runtime_imports(path: Path) -> list[Import]:
    return [i for i in _imports(path) if not i.type_only]


def _names(target: str, *prefixes: str) -> bool:
    """Whether ``target`` is one of ``prefixes`` or inside it."""
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _core(*names: str) -> tuple[str, ...]:
    return tuple(f"{RL}.{name}" for name in names)


def _in(folder: str) -> list[Path]:
    return [p for p in _sources(CORE) if p.relative_to(CORE).parts[0] == folder]


def _broken(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [i.where() for p in paths for i in _runtime_imports(p) if _names(i.target, *forbidden)]


# --- (a) no import cycle -----------------------------------------------------------------


def _cycles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, {}):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, {}):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def _shortest_loop(edges: dict[str, dict[str, Import]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for other in edges.get(node, {}):
            if other == start:
                return [*paths[node], start]
            if other in members and other not in paths:
                paths[other] = [*paths[node], other]
                queue.append(other)
    return [start]


def test_no_import_cycle_among_core_modules():
    modules = _core_modules()
    edges: dict[str, dict[str, Import]] = {}
    for name, path in modules.items():
        for imp in _runtime_imports(path):
            if imp.target in modules and imp.target != name:
                edges.setdefault(name, {}).setdefault(imp.target, imp)
    problems = []
    for component in _cycles(edges):
        loop = _shortest_loop(edges, component)
        links = [edges[a][b].where() for a, b in itertools.pairwise(loop)]
        problems.append(f"import cycle among {component}, e.g.: " + " -> ".join(links))
    assert not problems, "\n".join(problems)


# --- (b) file size -----------------------------------------------------------------------


def test_no_python_file_in_core_or_plugins_is_over_600_lines():
    too_long = [
        f"{p.relative_to(REPO)}: {n} lines (at most {MAX_LINES}: split it by job)"
        for p in _sources(CORE) + _sources(PLUGINS)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not too_long, "\n".join(too_long)


# --- (c)-(h) who may import whom ---------------------------------------------------------


def test_wire_imports_no_server_web_client_httpx_or_ray():
    forbidden = (*_core("server", "client", *WEB), "httpx", "ray")
    assert not (broken := _broken(_in("wire"), forbidden)), "\n".join(broken)


def test_server_never_imports_web_client_or_testing():
    forbidden = _core(*WEB, "client", "testing")
    assert not (broken := _broken(_in("server"), forbidden)), "\n".join(broken)


def test_server_modules_below_jobs_never_import_jobs():
    below = [p for p in _in("server") if p.stem not in SERVER_ABOVE_JOBS]
    broken = [
        f"{i.where()} (below jobs.py: take Job/JobState from server.job_state)"
        for p in below
        for i in _imports(p)  # a type-only import of jobs is the cycle's seed too
        if _names(i.target, f"{RL}.server.jobs")
    ]
    assert not broken, "\n".join(broken)


def _not_allowed(folder: str, allowed: tuple[str, ...]) -> list[str]:
    """The runtime imports of core modules (other than the package) from ``folder``'s files
    that ``allowed`` does not cover."""
    return [
        i.where()
        for p in _in(folder)
        for i in _runtime_imports(p)
        if _names(i.target, RL) and i.target != RL and not _names(i.target, *allowed)
    ]


def test_weight_sync_imports_only_the_ground_floor_and_config():
    broken = _not_allowed("weight_sync", _core(*GROUND_FLOOR, "config", "weight_sync"))
    assert not broken, "\n".join(broken)


def test_agents_imports_only_the_ground_floor_config_wire_and_batch():
    broken = _not_allowed("agents", _core(*AGENTS_MAY_IMPORT))
    assert not broken, "\n".join(broken)


def test_a_lazy_re_export_counts_as_an_import_of_the_module_behind_it():
    """``from arctic_platform.rl import ArcticRLClient`` loads the client: in agents/ it breaks
    the agents rule like ``from arctic_platform.rl.client import ...`` would."""
    source = CORE / "agents" / "planted.py"
    text = "from arctic_platform.rl import ArcticRLClient, __version__\n"
    text += "from arctic_platform.rl.api import RLServer\n"
    targets = [i.target for i in _imports_in(source, text)]
    assert targets == [f"{RL}.client", RL, f"{RL}.server.rl_server"]
    allowed = _core(*AGENTS_MAY_IMPORT)
    assert [t for t in targets if t != RL and not _names(t, *allowed)] == targets[::2]


def test_ground_floor_modules_import_nothing_of_arctic_platform_rl():
    floor = [CORE / f"{name}.py" for name in GROUND_FLOOR]
    broken = [i.where() for p in floor for i in _imports(p) if _names(i.target, RL)]
    assert not broken, "\n".join(broken)


def test_only_web_imports_fastapi_starlette_uvicorn_or_httpx_in_core():
    others = [p for p in _sources(CORE) if p.relative_to(CORE).parts[0] != "web"]
    assert not (broken := _broken(others, HTTP_LIBRARIES)), "\n".join(broken)


def test_no_core_module_imports_testing():
    others = [p for p in _sources(CORE) if p != CORE / "testing.py"]
    assert not (broken := _broken(others, _core("testing"))), "\n".join(broken)


def test_test_file_names_are_unique() -> None:
    """pytest imports test files by base name (rootdir mode, no packages): two files of one name
    in different folders stop the whole collection ("import file mismatch")."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "__pycache__" in path.parts:
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(REPO)} and {path.relative_to(REPO)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files share a name: " + "; ".join(clashes)
