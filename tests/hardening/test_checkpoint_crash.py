"""SIGKILL during ``save_checkpoint``: the previous checkpoint stays loadable, none half-written.

A real DeepSpeed training engine (a ~14 M-parameter model, so a save takes a while) runs in
a subprocess that trains and saves; the test kills it with SIGKILL at several points of a
save, each the moment a file of that stage appears on disk (the temp directory, DeepSpeed's
state, the Hugging Face export, the completion marker, the published directory). Each next
process loads the newest complete checkpoint: the interrupted save if its marker was written
before the kill, else the previous one, with exactly the weights it was saved with. No
visible directory in the checkpoint root may lack the completion marker.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("ckpt_crash_worker.py")


def _has_file(path: Path) -> bool:
    try:
        return any(p.is_file() for p in path.rglob("*"))
    except OSError:  # renamed or removed while listed
        return False


KILL_POINTS: dict[str, Callable[[Path, Path, str], bool]] = {
    "the temp directory is made": lambda tmp, final, marker: tmp.is_dir(),
    "DeepSpeed's state is being written": lambda tmp, final, marker: _has_file(tmp / "deepspeed"),
    "the Hugging Face export is being written": lambda tmp, final, marker: _has_file(tmp / "hf"),
    # the marker is renamed into place within milliseconds, so this is "written, maybe
    # already published": either way the save is complete when the kill lands
    "the completion marker is written": lambda tmp, final, marker: (
        (tmp / marker).is_file() or (final / marker).is_file()
    ),
    "the save is published": lambda tmp, final, marker: (final / marker).is_file(),
}
"""Where the SIGKILL lands: the moment the check on ``(temp dir, final dir, marker name)``
first holds during a save. The first three are inside the save, before its marker."""
BEFORE_MARKER = 3
EVENT_TIMEOUT = 300.0
DIST_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
"""Left out of the worker's environment: it is a world of its own (a fresh port)."""


class Worker:
    """The worker subprocess and its stream of JSON events."""

    def __init__(self, model: str, root: Path, saves: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), model, str(root), str(saves)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k not in DIST_ENV},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def expect(self, event: str) -> dict[str, Any]:
        """The next event, which must be ``event``."""
        deadline = time.monotonic() + EVENT_TIMEOUT
        while True:
            try:
                got = self.events.get(timeout=1.0)
                break
            except queue.Empty:
                exited = self.proc.poll() is not None and self.events.empty()
                if exited or time.monotonic() > deadline:
                    self.kill()
                    self._drainer.join(timeout=30)  # the stderr reader reaches the end
                    raise AssertionError(
                        f"no {event!r} event (worker exit code {self.proc.returncode}); "
                        f"stderr:\n{''.join(self.stderr[-40:])}"
                    ) from None
        assert got["event"] == event, (got, "".join(self.stderr[-40:]))
        return got

    def go(self) -> None:
        """Let the worker train and save (it waits after loading)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the worker and reap it."""
        self.proc.kill()
        self.proc.wait(timeout=60)

    def kill_when(self, point: str, tmp: Path, final: Path) -> None:
        """SIGKILL the worker the moment ``KILL_POINTS[point]`` holds (polled every ms)."""
        from arctic_rl_engines.ds_model import CHECKPOINT_MARKER

        check = KILL_POINTS[point]
        deadline = time.monotonic() + EVENT_TIMEOUT
        while not check(tmp, final, CHECKPOINT_MARKER):
            assert self.proc.poll() is None, f"the worker exited before {point}"
            assert time.monotonic() < deadline, f"never saw {point}"
            time.sleep(0.001)
        self.kill()


def _check_root(root: Path) -> None:
    """No visible directory without the completion marker; discovery picks a complete one,
    the newest visible or a newer save that completed but was cut before its rename."""
    from arctic_rl_engines import ds_checkpoint
    from arctic_rl_engines.ds_model import CHECKPOINT_MARKER

    visible = [p for p in root.iterdir() if not p.name.startswith(".")]
    partial = [p.name for p in visible if not (p / CHECKPOINT_MARKER).is_file()]
    assert not partial, f"partial checkpoint directories visible: {partial}"
    steps = {int(ds_checkpoint.read_marker(p)["global_step"]): p for p in visible}
    picked = ds_checkpoint.find_checkpoint(root)
    assert (picked / CHECKPOINT_MARKER).is_file()
    if picked.name.startswith("."):
        assert int(ds_checkpoint.read_marker(picked)["global_step"]) > max(steps)
    else:
        assert picked == steps[max(steps)]


@pytest.fixture(scope="module")
def bigger_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ~14 M-parameter model: big enough that a save is long enough to be hit."""
    from arctic_platform.rl.testing import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "crash-model"
    return str(build_tiny_model(path, hidden_size=512, num_layers=4, intermediate_size=1536))


def test_sigkill_during_save_checkpoint_never_loses_the_previous_checkpoint(
    bigger_model: str, tmp_path: Path
):
    from arctic_rl_engines.ds_model import CHECKPOINT_MARKER

    root = tmp_path / "checkpoints"
    norms: dict[int, float] = {}
    finished: list[int] = []  # steps whose save reported success
    inside_save = 0  # kills that left the interrupted save's temp directory behind

    worker = Worker(bigger_model, root, saves=2 + len(KILL_POINTS))
    worker.expect("fresh")
    worker.go()
    for _ in range(2):  # two whole saves before the first kill
        saving = worker.expect("saving")
        norms[saving["step"]] = saving["norm"]
        saved = worker.expect("saved")
        finished.append(saved["step"])
        save_seconds = float(saved["seconds"])
    _check_root(root)

    expected = finished[-1]  # what the next process must load
    for index, point in enumerate(KILL_POINTS):
        if index > 0:  # a new process: what does it find?
            worker = Worker(bigger_model, root, saves=1)
            loaded = worker.expect("loaded")
            assert loaded["step"] == expected, (point, loaded, finished)
            assert loaded["norm"] == pytest.approx(norms[loaded["step"]], rel=1e-12, abs=0)
            if loaded["step"] != finished[-1]:
                finished.append(loaded["step"])  # its marker was written before the kill
            # The partial temp directory of the killed save (ignored by that load) goes, so
            # the next save's files are the only ones a kill point can see.
            for stale in root.glob(".*.tmp"):
                if not (stale / CHECKPOINT_MARKER).is_file():
                    shutil.rmtree(stale)
            worker.go()
        saving = worker.expect("saving")
        norms[saving["step"]] = saving["norm"]
        tmp = root / f".global_step{saving['step']}.tmp"
        final = root / f"global_step{saving['step']}"
        worker.kill_when(point, tmp, final)
        complete = (tmp / CHECKPOINT_MARKER).is_file() or (final / CHECKPOINT_MARKER).is_file()
        inside_save += int(tmp.exists() and not complete)
        if index < BEFORE_MARKER:
            assert tmp.exists() and not complete, f"the kill at {point!r} missed the save"
        else:
            assert complete, f"the kill at {point!r} landed before the marker"
        expected = saving["step"] if complete else finished[-1]
        while not worker.events.empty():
            event = worker.events.get()
            if event["event"] == "saved":
                finished.append(event["step"])
        _check_root(root)

    last = Worker(bigger_model, root, saves=0)
    loaded = last.expect("loaded")
    last.go()
    last.proc.wait(timeout=120)
    assert loaded["step"] == expected == max(norms)  # the last kill came after the publish
    assert loaded["norm"] == pytest.approx(norms[loaded["step"]], rel=1e-12, abs=0)
    print(
        f"\ncheckpoint crash: {len(KILL_POINTS)} SIGKILLs, {inside_save} inside a save "
        f"(a whole save took {save_seconds:.2f} s), survived all, last loaded step "
        f"{loaded['step']}, completed saves {finished}, data lost 0"
    )
    assert inside_save == BEFORE_MARKER
