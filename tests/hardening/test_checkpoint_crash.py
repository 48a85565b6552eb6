"""SIGKILL during ``save_checkpoint``: the previous checkpoint stays loadable, none half-written.

A real DeepSpeed training engine (a ~14 M-parameter model, so a save takes a while) runs in
a subprocess that trains and saves; the test kills it with SIGKILL at several points of a
save (fractions of a measured save time). Each next process loads the newest complete
checkpoint: it must be the last one whose save finished (or the interrupted one, if its
rename landed before the kill), with exactly the weights it was saved with. No visible
directory in the checkpoint root may lack the completion marker.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("ckpt_crash_worker.py")
KILL_FRACTIONS = (0.05, 0.3, 0.6, 0.85, 1.0, 1.3)
"""Where the SIGKILL lands, as fractions of a whole save's duration (1.0 and past it: near
the rename that publishes the save, or just after it)."""
EVENT_TIMEOUT = 300.0
DIST_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
"""Left out of the worker's environment: it is a world of its own (a fresh port)."""


class Worker:
    """The worker subprocess and its stream of JSON events."""

    def __init__(self, model: str, root: Path, saves: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), model, str(root), str(saves)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k not in DIST_ENV},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

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
                    time.sleep(0.5)  # let the stderr reader catch up
                    raise AssertionError(
                        f"no {event!r} event (worker exit code {self.proc.returncode}); "
                        f"stderr:\n{''.join(self.stderr[-40:])}"
                    ) from None
        assert got["event"] == event, (got, "".join(self.stderr[-40:]))
        return got

    def kill(self) -> None:
        """SIGKILL the worker and reap it."""
        self.proc.kill()
        self.proc.wait(timeout=60)


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
    root = tmp_path / "checkpoints"
    norms: dict[int, float] = {}
    finished: list[int] = []  # steps whose save reported success
    inside_save = 0  # kills that left the interrupted save's temp directory behind

    worker = Worker(bigger_model, root, saves=2 + len(KILL_FRACTIONS))
    worker.expect("fresh")
    for _ in range(2):  # two whole saves; the second (warm) one sets the kill times
        saving = worker.expect("saving")
        norms[saving["step"]] = saving["norm"]
        saved = worker.expect("saved")
        finished.append(saved["step"])
        save_seconds = float(saved["seconds"])
    _check_root(root)

    for index, fraction in enumerate(KILL_FRACTIONS):
        if index > 0:  # a new process: what does it find?
            worker = Worker(bigger_model, root, saves=1)
            loaded = worker.expect("loaded")
            assert loaded["step"] in (finished[-1], max(norms)), (loaded, finished)
            assert loaded["norm"] == pytest.approx(norms[loaded["step"]], rel=1e-12, abs=0)
            if loaded["step"] != finished[-1]:
                finished.append(loaded["step"])  # its rename landed just before the kill
        saving = worker.expect("saving")
        norms[saving["step"]] = saving["norm"]
        time.sleep(fraction * save_seconds)
        worker.kill()
        tmp = root / f".global_step{saving['step']}.tmp"
        final = root / f"global_step{saving['step']}"
        inside_save += int(tmp.exists() and not final.exists())
        while not worker.events.empty():
            event = worker.events.get()
            if event["event"] == "saved":
                finished.append(event["step"])
        _check_root(root)

    last = Worker(bigger_model, root, saves=0)
    loaded = last.expect("loaded")
    last.proc.wait(timeout=120)
    assert loaded["step"] in (finished[-1], max(norms))
    assert loaded["norm"] == pytest.approx(norms[loaded["step"]], rel=1e-12, abs=0)
    print(
        f"\ncheckpoint crash: {len(KILL_FRACTIONS)} SIGKILLs, {inside_save} inside a save "
        f"(save took {save_seconds:.2f} s), survived all, last loaded step {loaded['step']}, "
        f"completed saves {finished}, data lost 0"
    )
    assert inside_save >= 1, "no kill landed inside a save: the test proved nothing"
