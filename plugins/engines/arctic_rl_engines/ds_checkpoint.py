"""Checkpoint layout, atomic publication, discovery and RNG state of the training engine.

A checkpoint is a directory ``<root>/<tag>/`` holding ``deepspeed/`` (DeepSpeed's own state:
weights, optimizer, scheduler, step), ``rng/rank<r>.pt``, ``hf/`` (``save_pretrained``
weights and tokenizer; in LoRA mode ``adapter/`` instead, a PEFT adapter directory, and
``deepspeed/`` leaves out the frozen base) and, written last, ``arctic_rl_checkpoint.json``
(its ``lora`` and ``base_model`` say which mode wrote it). It is built in
``<root>/.<tag>.tmp`` and renamed into place, so a crash leaves either no checkpoint or a
hidden temp directory that discovery ignores. Replacing a tag renames the older copy to
``.<tag>.old`` first; a crash between the two renames leaves no ``<tag>``, and discovery then
takes the complete hidden copy (``stranded``) instead of losing the tag.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import (
    CheckpointError,
    CheckpointNotFoundError,
    EngineConfigError,
)
from arctic_rl_engines.ds_model import CHECKPOINT_MARKER, HF_EXPORT_DIR

DEEPSPEED_TAG = "deepspeed"
FORMAT_VERSION = 1


def check_tag(tag: str) -> str:
    """A tag is one visible path component: no separators, no leading dot."""
    if not isinstance(tag, str) or not tag or tag in (".", "..") or tag.startswith("."):
        raise CheckpointError(f"checkpoint tag {tag!r} must be a non-empty name not starting '.'")
    if "/" in tag or os.sep in tag:
        raise CheckpointError(f"checkpoint tag {tag!r} must not contain a path separator")
    return tag


def temp_dir(root: Path, tag: str) -> Path:
    """Where the checkpoint ``tag`` is assembled before it is published."""
    return root / f".{tag}.tmp"


def read_marker(path: Path) -> dict[str, Any]:
    """The metadata of a complete checkpoint at ``path``."""
    try:
        return dict(json.loads((path / CHECKPOINT_MARKER).read_text()))
    except (OSError, ValueError) as exc:
        raise CheckpointNotFoundError(
            f"{path} is not a complete Arctic RL checkpoint ({exc})"
        ) from exc


def write_marker(path: Path, meta: dict[str, Any]) -> None:
    """Write the completion marker (last file of a checkpoint), flushed to disk and renamed
    into place, so a marker that exists is whole (a kill mid-write leaves only the part)."""
    target = path / CHECKPOINT_MARKER
    part = path / f".{CHECKPOINT_MARKER}.part"
    with open(part, "w") as f:
        json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, target)


def publish(tmp: Path, final: Path) -> None:
    """Move the finished ``tmp`` to ``final`` by rename, replacing an older ``final``."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    try:
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories cannot be fsynced everywhere
        pass


def stranded(final: Path) -> Path | None:
    """The complete checkpoint a publish cut between its two renames left hidden, if any.

    ``publish`` moves an older ``final`` to ``.final.old`` and then ``.final.tmp`` to
    ``final``; a crash in between leaves no ``final`` but one or two complete hidden copies.
    The new one (``.tmp``) is preferred, then the one it was replacing (``.old``).
    """
    if final.exists():
        return None
    for hidden in (temp_dir(final.parent, final.name), final.with_name(f".{final.name}.old")):
        if (hidden / CHECKPOINT_MARKER).is_file():
            return hidden
    return None


def _visible_name(child: Path) -> str | None:
    """The checkpoint name a hidden ``.name.tmp``/``.name.old`` directory stands for."""
    for suffix in (".tmp", ".old"):
        if child.name.startswith(".") and child.name.endswith(suffix):
            return child.name[1 : -len(suffix)] or None
    return None


def find_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a complete checkpoint, else its newest complete child.

    Hidden directories (temp or replaced checkpoints) are chosen only when a publish was cut
    short and left no visible checkpoint of that name (``stranded``).
    """
    p = Path(path)
    if (p / CHECKPOINT_MARKER).is_file():
        return p
    if not p.is_dir():
        left = stranded(p)
        if left is not None:
            return left
        raise CheckpointNotFoundError(f"no checkpoint at {p}: it does not exist")
    found: list[tuple[int, float, Path]] = []
    for child in p.iterdir():
        if not (child / CHECKPOINT_MARKER).is_file():
            continue
        if child.name.startswith("."):
            name = _visible_name(child)
            if name is None or stranded(p / name) != child:
                continue
        try:
            step = int(read_marker(child).get("global_step", -1))
        except CheckpointError:
            continue
        found.append((step, child.stat().st_mtime, child))
    if not found:
        raise CheckpointNotFoundError(
            f"no complete checkpoint in {p} (a complete one holds {CHECKPOINT_MARKER})"
        )
    return max(found)[2]


def is_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is, or directly holds, a complete Arctic RL checkpoint."""
    try:
        find_checkpoint(path)
    except CheckpointError:
        return False
    return True


def start_point(checkpoint_path: str | None, model_name: str) -> tuple[Path | None, str]:
    """Where a run starts: ``(checkpoint to resume or None, Hugging Face weights to load)``.

    ``checkpoint_path`` is the run's checkpoint root: holding a checkpoint, the newest one is
    resumed; a Hugging Face model directory gives the start weights; empty or missing, the
    run starts from ``model_name`` (and saves there). A file is an ``EngineConfigError``.
    """
    if not checkpoint_path:
        return None, model_name
    root = Path(checkpoint_path).expanduser()
    if root.exists() and not root.is_dir():
        raise EngineConfigError(
            f"checkpoint_path={checkpoint_path!r} is a file; it must be a directory: the run's "
            "checkpoint root (missing or empty: the run starts from model_name and saves there)"
        )
    if is_checkpoint(root):
        resume = find_checkpoint(root)
        return resume, str(hf_dir(resume))
    if (root / "config.json").is_file():
        return None, str(root)
    return None, model_name


def base_source(meta: dict[str, Any], model_name: str) -> str:
    """The run's initial weights a checkpoint's marker names (its KL reference, and the base
    of a LoRA run), or ``model_name`` when that path no longer exists."""
    saved = meta.get("reference_source")
    usable = saved and (Path(saved).exists() or not Path(saved).is_absolute())
    return str(saved) if usable else model_name


def hf_dir(checkpoint: Path) -> Path:
    """The Hugging Face export inside a checkpoint."""
    return checkpoint / HF_EXPORT_DIR


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch, accelerator) as plain data + tensors."""
    import numpy as np
    import torch
    from deepspeed.accelerator import get_accelerator

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, torch.from_numpy(np.asarray(keys).copy()), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    accel = get_accelerator()
    if accel.device_name() != "cpu":
        state["accelerator"] = accel.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    import numpy as np
    import torch
    from deepspeed.accelerator import get_accelerator

    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "accelerator" in state and get_accelerator().device_name() != "cpu":
        get_accelerator().set_rng_state(state["accelerator"])


def save_rng(checkpoint_dir: Path, rank: int) -> None:
    """Write this rank's RNG state into the checkpoint being built."""
    import torch

    folder = checkpoint_dir / "rng"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), folder / f"rank{rank}.pt")


def load_rng(checkpoint_dir: Path, rank: int) -> bool:
    """Restore this rank's RNG state if the checkpoint has it; returns whether it did."""
    import torch

    path = checkpoint_dir / "rng" / f"rank{rank}.pt"
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=True))
    return True
