"""Size-rotated server logs: the file rotates at its bound, keeps N backups, and a process
whose fds 1 and 2 are redirected (its own prints, raw fd writes, a child's output) never
leaves more than the bound on disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arctic_platform.rl.server.log_rotation import RotatingLogFile, rotated_paths


def test_the_file_rotates_at_its_bound_and_keeps_n_backups(tmp_path):
    path = tmp_path / "server.log"
    log = RotatingLogFile(path, max_bytes=1000, backups=2)
    for i in range(100):
        log.write(f"line {i:04d} ".encode() + b"x" * 89 + b"\n")  # 100 B a line
    log.close()
    assert log.rotations == 9
    files = rotated_paths(path, 2)
    assert all(p.exists() for p in files)
    assert not path.with_name("server.log.3").exists()
    assert all(p.stat().st_size <= 1000 for p in files)
    # nothing is lost within what is kept: the newest lines, in order, across the files
    kept = b"".join(p.read_bytes() for p in reversed(files)).decode().splitlines()
    assert [int(line.split()[1]) for line in kept] == list(range(70, 100))


def test_no_backups_truncates(tmp_path):
    path = tmp_path / "server.log"
    log = RotatingLogFile(path, max_bytes=50, backups=0)
    for _ in range(10):
        log.write(b"y" * 30)
    log.close()
    assert path.stat().st_size == 60  # at most the bound plus one write
    assert not path.with_name("server.log.1").exists()


def test_bad_bounds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        RotatingLogFile(tmp_path / "a.log", max_bytes=0, backups=1)
    with pytest.raises(ValueError, match="backups"):
        RotatingLogFile(tmp_path / "a.log", max_bytes=10, backups=-1)


def test_redirected_output_of_a_process_and_its_child_is_rotated(tmp_path):
    path = tmp_path / "server.log"
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from pathlib import Path
        from arctic_platform.rl.server.log_rotation import RotatingOutput
        RotatingOutput(Path({str(path)!r}), max_bytes=20_000, backups=2).start()
        for i in range(25000):  # ~300 KB: several rotations
            print(f"print {{i:05d}}", flush=True)
        subprocess.run([sys.executable, "-c", "print('child ' * 2000)"], check=True)
        for i in range(1000):
            os.write(2, f"fd2 {{i:05d}}\\n".encode())
        print("last line", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"" and done.stderr == b""  # everything went to the file
    files = [p for p in rotated_paths(path, 2) if p.exists()]
    assert len(files) == 3
    assert not Path(f"{path}.3").exists()
    assert all(p.stat().st_size <= 20_000 + 65_536 for p in files)
    assert path.read_text().rstrip().endswith("last line")
    kept = "".join(p.read_text() for p in reversed(files))
    # the newest ~22 KB (the child's line, the raw fd-2 writes, the last print) fit in what
    # is kept: at least the bound in each of the two rotated files
    assert "child child" in kept and "fd2 00000" in kept and "fd2 00999" in kept


def test_serve_refuses_bad_log_settings(tmp_path):
    from arctic_platform.rl.cli import main

    log = tmp_path / "s.log"
    assert main(["serve", "--log-file", str(log), "--log-max-mb", "0"]) == 2
    assert main(["serve", "--log-file", str(log), "--log-backups", "-1"]) == 2
    assert not log.exists()  # refused before anything was redirected
