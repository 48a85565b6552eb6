"""Dense padded batches become ragged rows; the store survives a restart honestly."""

from __future__ import annotations

import numpy as np
import pytest

from arctic_platform.rl.protocol import BatchError
from arctic_rl_dss.batches import dense_to_rows
from arctic_rl_dss.store import Store


def test_a_right_padded_dense_batch_is_trimmed_to_its_rows():
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    lp = np.array([[0.0, -1.0, -2.0, 9.0], [0.0, -3.0, 9.0, 9.0]])
    out = dense_to_rows(
        {"input_ids": ids, "attention_mask": mask, "old_log_probs": lp, "advantages": np.ones(2)}
    )
    assert out["input_ids"] == [[1, 2, 3], [4, 5]]
    assert out["old_log_probs"] == [[0.0, -1.0, -2.0], [0.0, -3.0]]
    assert out["advantages"] == [1.0, 1.0] and "attention_mask" not in out


def test_left_padding_or_a_mismatched_mask_is_refused():
    ids = np.array([[0, 1, 2]])
    with pytest.raises(BatchError, match="right-padded"):
        dense_to_rows({"input_ids": ids, "attention_mask": np.array([[0, 1, 1]])})
    with pytest.raises(BatchError, match="shape"):
        dense_to_rows({"input_ids": ids, "attention_mask": np.array([[1, 1]])})
    with pytest.raises(BatchError, match="dense input_ids"):
        dense_to_rows({"input_ids": [[1, 2]], "attention_mask": np.array([[1, 1]])})


def test_ragged_lists_pass_through():
    assert dense_to_rows({"input_ids": [[1, 2], [3]]}) == {"input_ids": [[1, 2], [3]]}


def test_a_restart_fails_unfinished_requests_and_jobs_and_never_reuses_numbers(tmp_path):
    store = Store(tmp_path / "p.sqlite3")
    subs = store.add_job("alice", "j1", {"x": 1}, [("j1:training:0", "training", 7, 1)])
    done, _ = store.add_request("alice", "j1", "step", None)
    store.set_request(done, "done", has_result=1)
    running, _ = store.add_request("alice", "j1", "generate", None)
    store.set_request(running, "running")
    keyed, replayed = store.add_request("alice", "j1", "forward-backward", "fb:g", "sha")
    assert not replayed and store.add_request("alice", "j1", "x", "fb:g") == (keyed, True)
    store.close()

    again = Store(tmp_path / "p.sqlite3")
    assert again.request("alice", "j1", done)["status"] == "done"
    record = again.request("alice", "j1", running)
    assert record["status"] == "failed" and record["error_code"] == "server_restarted"
    assert "restarted" in (again.job("alice", "j1").lost_reason or "")
    more = again.add_job("alice", "j2", {}, [("j2:training:0", "training", 1, 1)])
    assert more[0].number > subs[0].number
    assert again.request_for_key("alice", "j1", "fb:g") == (keyed, "sha")
    assert again.job("bob", "j1") is None and again.sub_job_by_number("bob", subs[0].number) is None
