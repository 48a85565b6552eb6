"""A real Prometheus (the distribution's binary) scrapes the session's live server through the
run dir's targets file (issue 35): every metric family the server and its workers record is
there, vLLM's own sampler metrics too, N fwd_bwd calls add exactly N to the operation's
histogram count, and every panel of the shipped Grafana dashboard has a query with data."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.servers import spawn, stop, wait_until

from arctic_platform.rl.observe.render import DASHBOARD

pytestmark = pytest.mark.slow

NEEDS_LORA = {"LoRA adapters live and parked, and swaps"}
"""Panels over a LoRA pool's metrics: the live server trains full weights, so only their
PromQL is checked here."""
LORA_FAMILIES = {"arctic_rl_lora_adapters", "arctic_rl_lora_swaps_total"}
CALLS = 3  # fwd_bwd calls whose count the histogram must show exactly


class Prometheus:
    """A Prometheus server on a free loopback port and its HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query (an invalid expression fails the test)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (expr, body)
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` (None when it has no series)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def until(self, expr: str, timeout: float = 45.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it has series; fail naming it after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(1.0)


@pytest.fixture(scope="module")
def prometheus(live: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus scraping the live server's run every second, started by ``arctic-rl
    prometheus``'s own command line."""
    from arctic_platform.rl.observe import prometheus as launcher
    from arctic_platform.rl.observe.discovery import TARGETS_FILE
    from arctic_platform.rl.testing import free_port

    if shutil.which("prometheus") is None:
        pytest.fail("no prometheus binary: ./run.sh setup installs the Debian package")
    targets = live.run_dir / TARGETS_FILE
    wait_until(targets.is_file, f"the server's metrics targets {targets}", 60)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = launcher.command(live.run_dir, port=port, scrape_seconds=1)

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    log = tmp_path_factory.mktemp("prometheus") / "prometheus.log"
    process = spawn(argv, log, ready, "prometheus", timeout=60)
    try:
        yield Prometheus(url)
    finally:
        stop(process, grace=15)


def _settled(prom: Prometheus, expr: str) -> float:
    """``expr``'s value once two reads 2 s apart agree (exports lag by about a second)."""
    last = prom.value(expr)
    for _ in range(30):
        time.sleep(2.0)
        now = prom.value(expr)
        if now is not None and now == last:  # None: not scraped yet
            return now
        last = now
    raise AssertionError(f"{expr} never settled (last {last})")


def _exercise(live: Any) -> None:
    """One of each kind of call: generate, log_probs, step, sync, a refused fwd_bwd, and an
    agent session's token-in turn."""
    client = live.client
    batch = {"input_ids": [[1, 5, 6, 7, 8], [1, 9, 10]], "advantages": [1.0, -1.0]}
    # every training and sampling result carries its queue and compute seconds and tokens
    trained = client.fwd_bwd(batch)
    assert trained["batch_tokens"] == 8 and trained["compute_seconds"] > 0, trained
    assert trained["queue_seconds"] >= 0
    stepped = client.step()
    assert stepped["compute_seconds"] > 0 and stepped["queue_seconds"] >= 0, stepped
    client.sync_weights()
    sampled = client.generate([[1, 5, 6]], {"n": 2, "max_tokens": 4})
    assert sampled["prompt_tokens"] == 3 and sampled["compute_seconds"] > 0, sampled
    made = sum(len(c["token_ids"]) for c in sampled["outputs"][0]["completions"])
    assert sampled["completion_tokens"] == made
    scored = client.log_probs([[1, 5, 6]], [[7, 8]])
    assert scored["tokens"] == 2 and scored["compute_seconds"] > 0, scored
    with httpx.Client(base_url=live.base_url, headers=live.auth, timeout=60) as http:
        refused = http.post(
            "/fwd-bwd",
            json={"job_id": live.job_ids["training"], "batch": batch, "loss_fn": "no-such-loss"},
        )
        assert refused.status_code == 422, refused.text
    session = client.open_session()
    url = session.base_url.removesuffix("/v1") + "/inference/v1/generate"
    key = {"Authorization": f"Bearer {session.api_key}"}
    for prompt in ([1, 5, 6], [1, 9, 10]):  # the second starts a new segment: a prefix break
        body = {"model": session.model, "token_ids": prompt, "sampling_params": {"max_tokens": 3}}
        turn = httpx.post(url, json=body, headers=key, timeout=60)
        assert turn.status_code == 200, turn.text
    client.close_session(session.session_id)


def _answered(live: Any) -> int:
    """How many fwd_bwd requests the server itself says it answered (its ``metrics`` route)."""
    with live.http(timeout=30) as http:
        return int(http.get("/metrics").json()["requests"].get("fwd_bwd", 0))


def _exported(prom: Prometheus, expr: str, want: float, timeout: float = 90.0) -> float | None:
    """``expr``'s value once it reaches ``want`` (exports lag a loaded machine by seconds);
    the last value read when ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while (value := prom.value(expr)) != want and time.monotonic() < deadline:
        time.sleep(1.0)
    return value


def test_n_fwd_bwd_calls_add_exactly_n_to_the_histogram_count(live, prometheus):
    live.assert_healthy()
    count = 'sum(ray_arctic_rl_request_duration_seconds_count{operation="fwd_bwd"})'
    before = _answered(live)
    if before:  # earlier modules' calls are all exported first (none: no series yet)
        assert _exported(prometheus, count, before) == before
    batch = {"input_ids": [[1, 5, 6, 7, 8], [1, 9, 10]], "advantages": [1.0, -1.0]}
    for _ in range(CALLS):
        live.client.fwd_bwd(batch)
    live.client.step()
    assert _answered(live) == before + CALLS
    assert _exported(prometheus, count, before + CALLS) == before + CALLS
    time.sleep(3.0)  # and no more arrive
    assert prometheus.value(count) == before + CALLS


@pytest.fixture(scope="module")
def exercised(live: Any, prometheus: Prometheus) -> None:
    """One call of each kind made (once for the module's scrape and dashboard tests)."""
    _exercise(live)


def test_every_family_and_vllms_sampler_metrics_are_scraped(prometheus, exercised):
    from arctic_platform.rl.observe.families import FAMILIES, VLLM_FAMILIES

    missing = []
    for family in FAMILIES:
        if family.name in LORA_FAMILIES:
            continue
        suffix = "_count" if family.kind == "histogram" else ""
        if not prometheus.until(f"max_over_time({family.exported}{suffix}[5m])", timeout=30):
            missing.append(family.exported)
    for name in VLLM_FAMILIES:
        suffix = "_count" if name.endswith("_seconds") else ""
        if not prometheus.until(f"max_over_time({name}{suffix}[5m])", timeout=10):
            missing.append(name)
    assert not missing, f"no series for {missing}"
    # label values stay bounded: no job, session or request id among them
    labels = prometheus.query('count by (__name__) ({__name__=~"ray_arctic_rl_.*"})')
    assert labels
    for series in prometheus.query('{__name__=~"ray_arctic_rl_.*"}'):
        for key in series["metric"]:
            assert not re.search(r"session|request_id|job_id|prompt", key), series["metric"]


def _substituted(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "5m")
    )


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_every_dashboard_panel_has_a_query_with_data(prometheus, exercised):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "arctic-rl" and dashboard["title"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    empty, checked = [], 0
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        exprs = [_substituted(t["expr"]) for t in panel["targets"]]
        if panel["title"] in NEEDS_LORA:
            for expr in exprs:
                prometheus.query(expr)  # valid PromQL
            continue
        deadline = time.monotonic() + 30
        while not any(prometheus.query(e) for e in exprs):
            if time.monotonic() > deadline:
                empty.append(panel["title"])
                break
            time.sleep(1.0)
        checked += 1
    assert checked >= 20
    assert not empty, f"dashboard panels without data: {empty}"


def test_arctic_rl_dashboard_draws_every_panel_from_the_prometheus(prometheus, exercised, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "board.png"
    argv = [sys.executable, "-m", "arctic_platform.rl.cli", "dashboard"]
    argv += ["--prometheus", prometheus.url, "--out", str(out), "--minutes", "5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.stat().st_size > 10_000
    no_data = (
        done.stdout.split("no data: ", 1)[1].strip().split("; ") if "no data" in done.stdout else []
    )
    assert set(no_data) <= NEEDS_LORA, done.stdout


def test_a_thousand_agent_sessions_add_no_series(live, prometheus):
    client = live.client
    client.close_session(client.open_session().session_id)  # each operation's series exist
    series = 'count({__name__=~"ray_arctic_rl_.*"})'
    before = _settled(prometheus, series)
    opened = [client.open_session().session_id for _ in range(1000)]
    for session_id in opened:
        client.close_session(session_id)
    assert _settled(prometheus, series) == before
