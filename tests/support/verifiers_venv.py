"""The separate virtual environment of verifiers (``.venv-verifiers`` at the repository root).

verifiers 0.4.0 pins ``openai<3`` while the project's venv holds openai 3.x, so its client runs
from a venv of its own, as a subprocess. ``ensure()`` builds that venv when it is missing or
was built for another pin (a stamp file inside it records the pinned spec), under a file lock
so two test processes never build it at once. A failed build raises ``VenvBuildError`` with
pip's output: a test that needs the venv fails, it never skips.

``./run.sh test`` runs this file as a script before pytest (stdlib only, so any Python runs
it), which builds the venv on a clean clone; the integration test calls ``ensure()`` again,
which is a stamp check when the venv is already there.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = "verifiers==0.4.0"
VENV_ENV = "ARCTIC_RL_VERIFIERS_VENV"
STAMP_NAME = ".arctic-rl-verifiers"
LOCK_NAME = ".arctic-rl-verifiers.lock"
BUILD_TIMEOUT_S = 1200.0


class VenvBuildError(RuntimeError):
    """Building the verifiers venv failed; the message holds the failing command's output."""


def venv_dir() -> Path:
    """Where the venv lives: ``$ARCTIC_RL_VERIFIERS_VENV``, else ``.venv-verifiers``."""
    return Path(os.environ.get(VENV_ENV) or REPO_ROOT / ".venv-verifiers").resolve()


def venv_python(venv: Path | None = None) -> Path:
    """The interpreter of the venv (it may not exist yet)."""
    return (venv or venv_dir()) / "bin" / "python"


def _stamp_text() -> str:
    """What the stamp must say for the venv to count as built: the spec and the Python."""
    return f"{SPEC} python{sys.version_info.major}.{sys.version_info.minor}\n"


def _run(args: list[str]) -> None:
    """Run ``args``; a ``VenvBuildError`` with its output when it fails or hangs."""
    try:
        done = subprocess.run(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else ""
        raise VenvBuildError(
            f"{' '.join(args)} ran past {BUILD_TIMEOUT_S:.0f} s:\n{output}"
        ) from None
    if done.returncode != 0:
        raise VenvBuildError(
            f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout[-20000:]}"
        )


COMPILE = (
    "import compileall, sysconfig; "
    "compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
)
"""Byte-compiles the venv's packages on every core (pip would on one, as it installs); a file
that does not compile (a template, Python 2) is left as it is."""


def is_current(venv: Path | None = None) -> bool:
    """Whether the venv exists with an interpreter and a stamp for the current spec."""
    venv = venv or venv_dir()
    stamp = venv / STAMP_NAME
    return venv_python(venv).exists() and stamp.exists() and stamp.read_text() == _stamp_text()


def ensure(log: bool = False) -> Path:
    """The venv's interpreter, after building the venv (``python -m venv``, then
    ``pip install SPEC``) if it is missing or stamped for another spec. A ``VenvBuildError``
    with pip's output when the build fails."""
    venv = venv_dir()
    if is_current(venv):
        return venv_python(venv)
    venv.mkdir(parents=True, exist_ok=True)
    with open(venv / LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it; wait for it
        if is_current(venv):
            return venv_python(venv)
        (venv / STAMP_NAME).unlink(missing_ok=True)
        if log:
            print(f"==> building {venv} ({SPEC})", file=sys.stderr, flush=True)
        _run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--quiet", "--no-compile", SPEC])
        _run([str(venv_python(venv)), "-c", COMPILE])
        (venv / STAMP_NAME).write_text(_stamp_text())
    return venv_python(venv)


def main() -> int:
    """Build the venv if needed and print its interpreter; 1 with pip's output on failure."""
    try:
        print(ensure(log=True))
    except VenvBuildError as exc:
        print(f"error: building the verifiers venv failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
