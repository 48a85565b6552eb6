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
from pathlib import Path

from arctic_platform.rl import api
from arctic_platform.rl.plugins import get_registry

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "core" / "arctic_platform"
PLUGIN_ROOTS = (REPO / "plugins", REPO / "tests" / "example_plugin")
PUBLIC = "arctic_platform.rl.api"
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


def test_plugins_import_nothing_of_core_but_the_api_module():
    offenders = []
    for path in _sources(*PLUGIN_ROOTS):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree):
            if not module.startswith("arctic_platform"):
                continue
            if module == PUBLIC or module.startswith(PUBLIC + "."):
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
        "loaded = [m for m in heavy if m in sys.modules and m != 'fastapi']\n"
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
