"""Size-rotated server logs: this process's stdout and stderr go through a pipe into
``server.log``, which is renamed to ``server.log.1`` (and so on) when it passes a size.

The file descriptors 1 and 2 themselves are redirected, so what writes to them without Python
(Ray's forwarded worker lines, C extensions, subprocesses that inherit them) is rotated too.
Settings: ``arctic-rl serve --log-max-mb/--log-backups``, whose defaults come from the
``ARCTIC_RL_LOG_MAX_MB`` and ``ARCTIC_RL_LOG_BACKUPS`` environment variables.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path

DEFAULT_MAX_MB = 64.0
DEFAULT_BACKUPS = 3
CHUNK_BYTES = 64 * 1024


def default_max_mb() -> float:
    """The size at which ``server.log`` rotates, in MB (``ARCTIC_RL_LOG_MAX_MB`` or 64)."""
    return float(os.environ.get("ARCTIC_RL_LOG_MAX_MB", DEFAULT_MAX_MB))


def default_backups() -> int:
    """How many rotated files are kept (``ARCTIC_RL_LOG_BACKUPS`` or 3)."""
    return int(os.environ.get("ARCTIC_RL_LOG_BACKUPS", DEFAULT_BACKUPS))


def rotated_paths(path: Path, backups: int) -> list[Path]:
    """``path`` and its rotated files, newest first: ``path``, ``path.1`` … ``path.N``."""
    return [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, backups + 1)]


class RotatingLogFile:
    """An append-only log file that rotates by size: at most ``max_bytes`` plus one write per
    file, ``backups`` older files kept (0: the file is truncated instead)."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError(f"max_bytes={max_bytes} must be >= 1 and backups={backups} >= 0")
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.rotations = 0
        self._file = path.open("ab")

    def write(self, data: bytes) -> None:
        """Append ``data``; rotate first when the file already holds ``max_bytes``."""
        if self._file.tell() >= self.max_bytes:
            self.rotate()
        self._file.write(data)
        self._file.flush()

    def rotate(self) -> None:
        """Shift ``path.i`` to ``path.i+1`` (dropping the oldest) and start an empty ``path``."""
        self._file.close()
        paths = rotated_paths(self.path, self.backups)
        if self.backups:
            paths[-1].unlink(missing_ok=True)
            for older, newer in zip(reversed(paths[1:]), reversed(paths[:-1]), strict=True):
                if newer.exists():
                    newer.rename(older)
            self._file = self.path.open("ab")
        else:
            self._file = self.path.open("wb")
        self.rotations += 1

    def close(self) -> None:
        """Close the current file."""
        self._file.close()


class RotatingOutput:
    """Redirects this process's fds 1 and 2 into a ``RotatingLogFile`` through a pipe that a
    daemon thread drains; ``stop()`` (also at exit) puts the old fds back and drains the rest."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.log = RotatingLogFile(path, max_bytes, backups)
        self._saved: tuple[int, int] | None = None
        self._reader: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RotatingOutput:
        """Begin redirecting; returns ``self``."""
        sys.stdout.flush()
        sys.stderr.flush()
        reader, writer = os.pipe()
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(writer, 1)
        os.dup2(writer, 2)
        os.close(writer)
        self._reader = reader
        self._thread = threading.Thread(target=self._pump, name="log-rotation", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        return self

    def _pump(self) -> None:
        assert self._reader is not None
        while True:
            try:
                data = os.read(self._reader, CHUNK_BYTES)
            except OSError:
                return
            if not data:  # every write end is closed
                return
            try:
                self.log.write(data)
            except OSError:  # a full disk: drop the chunk, keep the pipe drained
                continue

    def stop(self, drain_seconds: float = 2.0) -> None:
        """Put fds 1 and 2 back and let the thread write what is left (subprocesses that
        still hold the pipe keep it open: then it waits ``drain_seconds`` at most)."""
        if self._saved is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = self._saved
        self._saved = None
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        if self._thread is not None:
            self._thread.join(drain_seconds)
        if self._thread is None or not self._thread.is_alive():
            self.log.close()
