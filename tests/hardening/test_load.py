"""Concurrent load on one server: every generate request is answered exactly once.

A smaller run of ``bench/load.py`` (4 client processes x 10 concurrent requests): each
request's tag comes back as its prompt, the server's own count grows by exactly the number
sent, and the jobs keep serving. Times are printed, never asserted.
"""

from __future__ import annotations

import pytest

from bench.load import drive

pytestmark = pytest.mark.slow


def test_four_processes_of_ten_concurrent_generates_are_each_answered_exactly_once(live):
    result = drive(live.base_url, live.token, live.job_ids["sampling"], processes=4, concurrency=10)
    print(
        f"\nload: {result['answered']}/{result['sent']} answered, lost {result['lost']}, "
        f"duplicates {result['duplicates']}, p50 {result['p50_s'] * 1000:.0f} ms, "
        f"p99 {result['p99_s'] * 1000:.0f} ms"
    )
    assert result["failed"] == []
    assert result["lost"] == 0 and result["duplicates"] == 0
    assert result["answered"] == result["sent"] == 40
    assert result["server_counted"] == 40 and result["server_errors"] == 0
    live.assert_healthy()
