"""Mutation testing of the pure core with mutmut 3, one module at a time.

mutmut names a mutant after its file's path and puts only ``mutants/``, ``mutants/src`` or
``mutants/source`` on ``sys.path``, so our ``core/arctic_platform`` layout cannot be mutated
in place. Each module therefore runs in a stage, ``mutants/<module>/``, whose ``src`` links to
``core/`` and whose ``pyproject.toml`` is ``[tool.mutmut]`` of ours plus that module's file and
fast unit tests. A survivor counts as dealt with when ``tests/mutation/allowlist.txt`` names it
with the line it changes and a reason.

    python tests/mutation/run_mutation.py [module ...] [--max-children N] [--goal 85]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ALLOWLIST = REPO / "tests" / "mutation" / "allowlist.txt"
DEFAULT_GOAL = 85.0

# What counts as caught: mutmut's statuses that mean a test (or the type checker) failed.
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}
# What does not: the mutant ran green, or no test reached it, or it was not decided.
UNCAUGHT = {"survived", "no tests", "suspicious", "not checked", "check was interrupted by user"}


@dataclass(frozen=True)
class Module:
    """One module to mutate: its file under ``core/`` and the fast unit tests that cover it."""

    source: str
    tests: tuple[str, ...]


MODULES: dict[str, Module] = {
    "config": Module("arctic_platform/rl/config.py", ("tests/unit/test_config.py",)),
    "losses": Module("arctic_platform/rl/losses.py", ("tests/unit/test_losses.py",)),
    # a table and no function body: mutmut 3 mutates inside functions only, so none
    "operations": Module(
        "arctic_platform/rl/wire/operations.py", ("tests/unit/test_http_wire.py",)
    ),
    "job_table": Module("arctic_platform/rl/server/job_table.py", ("tests/unit/server",)),
    "job_log": Module("arctic_platform/rl/server/job_log.py", ("tests/unit/server",)),
    "schedule": Module(
        "arctic_platform/rl/weight_sync/schedule.py", ("tests/unit/weight_sync/test_schedule.py",)
    ),
    "buckets": Module(
        "arctic_platform/rl/weight_sync/buckets.py",
        ("tests/unit/weight_sync/test_buckets.py", "tests/unit/test_weight_sync_import.py"),
    ),
    # (not test_hookspecs.py: its meta-test reads a whole session's hook calls)
    "manager": Module(
        "arctic_platform/rl/plugins/manager.py", ("tests/unit/test_plugin_manager.py",)
    ),
    "registry": Module(
        "arctic_platform/rl/plugins/registry.py", ("tests/unit/test_plugin_manager.py",)
    ),
    # last: another change to wire/frames.py may land while the others run
    "protocol": Module("arctic_platform/rl/wire/frames.py", ("tests/unit/test_protocol.py",)),
}


@dataclass(frozen=True)
class Allowed:
    """An allow-list entry: a surviving mutant, the line it writes, and why it may survive."""

    name: str
    line: str
    reason: str


@dataclass
class Score:
    """The outcome of one module's run."""

    module: str
    total: int
    caught: int
    allowed: list[str]
    uncaught: dict[str, str]  # name -> status
    stale: list[str]  # allow-list entries whose mutant changed or is now caught
    lines: dict[str, str]  # the line each uncaught or allow-listed mutant writes

    @property
    def percent(self) -> float:
        """Caught or allow-listed, as a percentage of all mutants (100 when there are none)."""
        if self.total == 0:
            return 100.0
        return 100.0 * (self.caught + len(self.allowed)) / self.total

    @property
    def raw_percent(self) -> float:
        """Caught by tests alone, as a percentage of all mutants."""
        return 100.0 if self.total == 0 else 100.0 * self.caught / self.total


def read_allowlist(path: Path = ALLOWLIST) -> dict[str, Allowed]:
    """Parse ``name | changed line | reason`` lines; ``#`` starts a comment line."""
    entries: dict[str, Allowed] = {}
    if not path.exists():
        return entries
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, _, rest = raw.partition(" | ")
        line, _, reason = rest.rpartition(" | ")  # the line itself may hold " | "
        parts = [name.strip(), line.strip(), reason.strip()]
        if not all(parts):
            raise SystemExit(f"{path}:{number}: expected 'name | changed line | reason': {raw!r}")
        entries[parts[0]] = Allowed(*parts)
    return entries


def _stage_pyproject(module: Module) -> str:
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    shared = dict(root["tool"].get("mutmut", {}))
    shared["source_paths"] = ["src/arctic_platform"]
    shared["only_mutate"] = [f"src/{module.source}"]
    shared["pytest_add_cli_args_test_selection"] = list(module.tests)
    pytest_opts = root["tool"]["pytest"]["ini_options"]
    lines = ["[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in shared.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_opts.items()]
    return "\n".join(lines) + "\n"


def stage(name: str, root: Path, fresh: bool) -> Path:
    """Lay out ``<root>/<name>/`` (links to core/ and tests/, a generated pyproject)."""
    module = MODULES[name]
    where = root / name
    if fresh and (where / "mutants").exists():
        shutil.rmtree(where / "mutants")
    where.mkdir(parents=True, exist_ok=True)
    for link, target in (("src", "core"), ("tests", "tests")):
        path = where / link
        if not path.is_symlink():
            path.symlink_to(REPO / target, target_is_directory=True)
    text = _stage_pyproject(module)
    config = where / "pyproject.toml"
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    return where


def _mutmut(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "mutmut"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [str(exe), *args], cwd=where, env=env, text=True, capture_output=True, check=False
    )


def results(where: Path) -> dict[str, str]:
    """Every mutant of the stage and its status, from ``mutmut results --all true``."""
    done = _mutmut(where, "results", "--all", "true")
    if done.returncode != 0:
        raise SystemExit(f"mutmut results failed in {where}:\n{done.stdout}\n{done.stderr}")
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            out[name] = status
    return out


_DIFFS = """
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
path = Path(sys.argv[1])
print(json.dumps({name: get_diff_for_mutant(name, path=path) for name in sys.argv[2:]}))
"""


def changed_lines(where: Path, source: str, names: list[str]) -> dict[str, str]:
    """The first line each mutant writes (the ``+`` side of its diff), stripped; one process."""
    if not names:
        return {}
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-c", _DIFFS, f"src/{source}", *names],
        cwd=where,
        env=env,
        text=True,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"reading mutant diffs failed in {where}:\n{done.stderr[-3000:]}")
    out: dict[str, str] = {}
    for name, diff in json.loads(done.stdout).items():
        added = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] == "+" and ln[:3] != "+++"]
        out[name] = added[0] if added else ""
    return out


def run_module(
    name: str,
    max_children: int,
    allow: dict[str, Allowed],
    root: Path,
    fresh: bool = True,
    run: bool = True,
) -> Score:
    """Run mutmut on one module in its stage (unless ``run`` is False: score the last run)
    and score it against the allow-list."""
    where = stage(name, root, fresh and run)
    if run:
        done = _mutmut(where, "run", "--max-children", str(max_children))
        if done.returncode != 0:
            out = done.stdout[-4000:]
            raise SystemExit(f"mutmut run failed for {name}:\n{out}\n{done.stderr}")
    statuses = results(where)
    caught = sum(1 for s in statuses.values() if s in CAUGHT)
    unknown = {s for s in statuses.values()} - CAUGHT - UNCAUGHT - {"skipped"}
    if unknown:
        raise SystemExit(f"unknown mutmut statuses {sorted(unknown)}")
    total = sum(1 for s in statuses.values() if s != "skipped")
    allowed: list[str] = []
    uncaught: dict[str, str] = {}
    left = sorted(m for m, status in statuses.items() if status in UNCAUGHT)
    lines = changed_lines(where, MODULES[name].source, left)
    for mutant in left:
        entry = allow.get(mutant)
        if entry is not None and statuses[mutant] == "survived" and lines[mutant] == entry.line:
            allowed.append(mutant)
        else:
            uncaught[mutant] = statuses[mutant]
    prefix = MODULES[name].source.removesuffix(".py").replace("/", ".") + "."
    stale = [m for m in allow if m.startswith(prefix) and m not in allowed]
    return Score(name, total, caught, allowed, uncaught, stale, lines)


def report(score: Score) -> str:
    """A short human summary, with each uncaught mutant's changed line."""
    if score.total == 0:
        return f"{score.module}: no mutants (mutmut 3 mutates function bodies only)"
    lines = [
        f"{score.module}: {score.percent:.1f} % caught or allow-listed "
        f"({score.caught} killed + {len(score.allowed)} allow-listed of {score.total}; "
        f"killed alone {score.raw_percent:.1f} %)"
    ]
    for mutant, status in score.uncaught.items():
        lines.append(f"  {status}: {mutant} | {score.lines[mutant]}")
    for mutant in score.stale:
        lines.append(f"  stale allow-list entry (mutant changed or now killed): {mutant}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the named modules (all by default); exit 1 if any is below the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of: {', '.join(MODULES)}")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--goal", type=float, default=DEFAULT_GOAL)
    parser.add_argument("--json", type=Path, help="also write the scores here")
    parser.add_argument("--stage-root", type=Path, default=REPO / "mutants")
    parser.add_argument(
        "--keep", action="store_true", help="reuse earlier results (only if no test changed)"
    )
    parser.add_argument(
        "--score-only", action="store_true", help="score the last run again (allow-list edits)"
    )
    args = parser.parse_args(argv)
    names = args.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module {unknown}; choose from {', '.join(MODULES)}")
    allow = read_allowlist()
    failed = False
    scores = []
    for name in names:
        score = run_module(
            name, args.max_children, allow, args.stage_root, not args.keep, not args.score_only
        )
        scores.append(score)
        print(report(score), flush=True)
        failed |= score.percent < args.goal
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "module": s.module,
                        "total": s.total,
                        "killed": s.caught,
                        "allow_listed": len(s.allowed),
                        "percent": round(s.percent, 1),
                        "killed_percent": round(s.raw_percent, 1),
                    }
                    for s in scores
                ],
                indent=2,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
