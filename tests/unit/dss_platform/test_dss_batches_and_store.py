"""The platform's store survives a restart honestly (dense batches: tests/unit/test_batch.py)."""

from __future__ import annotations

from arctic_rl_dss.store import Store


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
