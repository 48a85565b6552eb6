"""Checkpoint discovery after a publish cut short: the tag is never lost, partial dirs never picked.

``ds_checkpoint.publish`` replaces a tag with two renames (old copy aside, new copy in). These
tests lay out on disk each state a SIGKILL can leave between and around those renames and
check what ``find_checkpoint`` picks. (The kill itself is exercised for real, at several
points of a save, in tests/hardening/test_checkpoint_crash.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arctic_platform.rl.errors import CheckpointNotFoundError
from arctic_rl_engines import ds_checkpoint
from arctic_rl_engines.ds_model import CHECKPOINT_MARKER


def _complete(path: Path, step: int) -> Path:
    path.mkdir(parents=True)
    (path / "deepspeed").mkdir()
    (path / CHECKPOINT_MARKER).write_text(json.dumps({"global_step": step}))
    return path


def _partial(path: Path) -> Path:
    (path / "deepspeed").mkdir(parents=True)
    return path


def test_a_partial_temp_dir_is_never_picked(tmp_path):
    _complete(tmp_path / "global_step1", 1)
    _partial(tmp_path / ".global_step2.tmp")
    assert ds_checkpoint.find_checkpoint(tmp_path) == tmp_path / "global_step1"


def test_a_cut_between_the_renames_keeps_the_tag_through_its_new_copy(tmp_path):
    _complete(tmp_path / "older", 1)
    _complete(tmp_path / ".latest.old", 5)  # the copy being replaced, moved aside
    _complete(tmp_path / ".latest.tmp", 9)  # the finished new copy, not yet renamed in
    assert ds_checkpoint.find_checkpoint(tmp_path) == tmp_path / ".latest.tmp"
    assert ds_checkpoint.find_checkpoint(tmp_path / "latest") == tmp_path / ".latest.tmp"


def test_a_replaced_copy_is_used_when_the_new_one_is_partial(tmp_path):
    _complete(tmp_path / ".latest.old", 5)
    _partial(tmp_path / ".latest.tmp")
    assert ds_checkpoint.find_checkpoint(tmp_path) == tmp_path / ".latest.old"
    assert ds_checkpoint.find_checkpoint(tmp_path / "latest") == tmp_path / ".latest.old"


def test_hidden_copies_are_ignored_once_the_tag_is_published(tmp_path):
    _complete(tmp_path / "latest", 9)
    _complete(tmp_path / ".latest.old", 12)  # leftover of an earlier replace
    assert ds_checkpoint.find_checkpoint(tmp_path) == tmp_path / "latest"


def test_nothing_complete_is_a_not_found_error_a_caller_can_act_on(tmp_path):
    _partial(tmp_path / ".latest.tmp")
    with pytest.raises(CheckpointNotFoundError, match="no complete checkpoint"):
        ds_checkpoint.find_checkpoint(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        ds_checkpoint.find_checkpoint(tmp_path / "missing")
    assert CheckpointNotFoundError.status == 404
