"""The test kit's leak scan (``support.leaks``) cannot pass by looking for nothing."""

from __future__ import annotations

import pytest
from support.leaks import files_holding


def test_a_secret_written_to_a_file_is_found_and_one_not_written_is_not(tmp_path):
    (tmp_path / "log").write_text("a line with s3cr3t-value in it\n")
    secrets = {"the key": "s3cr3t-value", "another": "never-written"}
    assert files_holding(secrets, [tmp_path]) == [f"the key in {tmp_path / 'log'}"]


@pytest.mark.parametrize("value", ["", None])
def test_an_empty_secret_is_an_error_not_a_pass(tmp_path, value):
    (tmp_path / "log").write_text("anything\n")
    with pytest.raises(AssertionError, match="empty secrets"):
        files_holding({"the key": value}, [tmp_path])  # type: ignore[dict-item]


def test_no_secrets_or_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(AssertionError, match="no secrets"):
        files_holding({}, [tmp_path])
    with pytest.raises(AssertionError, match="is missing"):
        files_holding({"k": "v"}, [tmp_path / "gone"])
