"""Prometheus service discovery for a run: every alive Ray node's metrics endpoint.

Ray writes such a file only when its dashboard runs; the server starts Ray without it, so it
writes its own (``file_sd_configs`` format) into the run dir and refreshes it as nodes come
and go: ``<run_dir>/prometheus/targets.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TARGETS_FILE = Path("prometheus") / "targets.json"
"""Where, under a run dir, the targets are written."""


def node_targets(nodes: list[dict[str, Any]]) -> list[str]:
    """``host:port`` of each alive node's metrics export, from ``ray.nodes()``, sorted."""
    out = set()
    for node in nodes:
        port = node.get("MetricsExportPort")
        host = node.get("NodeManagerAddress")
        if node.get("Alive") and port and host:
            out.add(f"{host}:{int(port)}")
    return sorted(out)


def targets_document(targets: list[str], run_dir: Path) -> list[dict[str, Any]]:
    """The ``file_sd_configs`` content: one group, labelled with the run dir's name."""
    return [{"targets": targets, "labels": {"job": "arctic_rl", "run": run_dir.name}}]


def write_targets(run_dir: Path, nodes: list[dict[str, Any]]) -> Path | None:
    """Write (atomically, only when it changed) the run's targets file; returns its path, or
    None when no node exports metrics."""
    targets = node_targets(nodes)
    if not targets:
        return None
    path = run_dir / TARGETS_FILE
    text = json.dumps(targets_document(targets, run_dir), indent=1) + "\n"
    if path.is_file() and path.read_text() == text:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".json.part")
    part.write_text(text)
    os.replace(part, path)
    return path


def refresh(run_dir: Path) -> Path | None:
    """Write the targets of the Ray cluster this process is connected to (None: not
    connected, or no node exports metrics)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return write_targets(run_dir, ray.nodes())
