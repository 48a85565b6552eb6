"""The metric catalogue, the recorder and what the server and workers record (issue 35)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from arctic_platform.rl.observe import (
    discovery,
    engine_metrics,
    families,
    prometheus,
    server_metrics,
)
from arctic_platform.rl.observe import recorder as recorder_module
from arctic_platform.rl.observe.recorder import Recorder

BOUNDED_LABELS = {
    "operation",
    "job_type",
    "status",
    "code",
    "direction",
    "api",
    "state",
    "kind",
    "segment",
    "device",
    "reason",
}
"""Every label a family may have: each takes values from a fixed set (never an id or text)."""


def test_every_family_follows_prometheus_naming_and_has_bounded_labels():
    names = [f.name for f in families.FAMILIES]
    assert len(names) == len(set(names))
    for f in families.FAMILIES:
        assert re.fullmatch(r"arctic_rl_[a-z0-9_]+", f.name), f.name
        assert (f.kind == "counter") == f.name.endswith("_total"), f.name
        if f.kind == "histogram":
            assert f.name.endswith("_seconds"), f.name
        assert set(f.labels) <= BOUNDED_LABELS, (f.name, f.labels)
        assert f.help and f.source in ("server", "worker")
        assert f.exported == "ray_" + f.name


def test_the_markdown_table_lists_every_family_once():
    table = families.markdown_table()
    for f in families.FAMILIES:
        assert table.count(f"`{f.exported}`") == 1


class _Captured:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def inc(self, value: float, tags: dict) -> None:
        self.log.append(("inc", self.name, value, tags))

    def set(self, value: float, tags: dict) -> None:
        self.log.append(("set", self.name, value, tags))

    def observe(self, value: float, tags: dict) -> None:
        self.log.append(("observe", self.name, value, tags))


class _Live(Recorder):
    """A recorder that is active and hands its buffers to a list instead of Ray (at
    ``flush``, as its flusher thread would)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, float, dict]] = []

    @staticmethod
    def active() -> bool:
        return True

    def _metric(self, spec: Any) -> Any:
        return _Captured(self.log, spec.name)


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> _Live:
    rec = _Live()
    monkeypatch.setattr(rec, "_keep", lambda: None)  # no gauge keeper thread in unit tests
    for name in ("inc", "observe", "set_gauge", "timed"):
        monkeypatch.setattr(recorder_module, name, getattr(rec, name.replace("_gauge", "")))
    monkeypatch.setattr(recorder_module, "RECORDER", rec)
    return rec


def test_a_recorder_without_ray_records_nothing_but_still_checks_labels(monkeypatch):
    rec = Recorder()
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    assert not rec.active()
    rec.inc("arctic_rl_job_starts_total", job_type="training", reason="create")  # a no-op
    with pytest.raises(ValueError, match="takes labels"):
        rec.inc("arctic_rl_job_starts_total", job_id="7")


def test_the_switch_turns_metrics_off(monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_METRICS", "0")
    assert not recorder_module.metrics_enabled()
    assert not Recorder.active()
    monkeypatch.setenv("ARCTIC_RL_METRICS", "1")
    assert recorder_module.metrics_enabled()


def test_gauges_are_kept_for_refresh_and_counters_skip_non_positive_values(live):
    live.set("arctic_rl_train_grad_norm", 2.5, job_type="training")
    live.set("arctic_rl_train_grad_norm", 1.5, job_type="training")
    assert live.gauges("arctic_rl_train_grad_norm") == {(("job_type", "training"),): 1.5}
    live.inc("arctic_rl_engine_tokens_total", 0, job_type="training", operation="fwd_bwd")
    live.flush()
    assert [e for e in live.log if e[0] == "inc"] == []
    live.forget("arctic_rl_train_grad_norm", job_type="training")
    assert live.gauges("arctic_rl_train_grad_norm") == {}


def test_a_recording_failure_never_reaches_the_caller(monkeypatch):
    rec = _Live()

    def broken(spec: Any) -> Any:
        raise RuntimeError("agent gone")

    monkeypatch.setattr(rec, "_metric", broken)
    monkeypatch.setattr(rec, "_keep", lambda: None)
    rec.inc("arctic_rl_job_starts_total", job_type="training", reason="create")
    rec.flush()  # logged once, not raised


def test_refresh_is_half_the_export_period_within_bounds(monkeypatch):
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "1000")
    assert recorder_module.refresh_seconds() == 0.5
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "60000")
    assert recorder_module.refresh_seconds() == 5.0
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "200")  # Ray floors it at 1 s
    assert recorder_module.refresh_seconds() == 0.5


def test_a_request_is_counted_timed_and_its_error_recorded(live):
    from arctic_platform.rl.errors import InvalidRequestError

    meter = server_metrics.RequestMeter()
    ok = meter.start("fwd_bwd", "training")
    assert live.gauges("arctic_rl_requests_in_flight") == {(("operation", "fwd_bwd"),): 1.0}
    ok.done()
    bad = meter.start("fwd_bwd", "training")
    bad.failed(InvalidRequestError("no"))
    bad.done()
    boom = meter.start("step", "training")
    boom.failed(RuntimeError("engine bug"))
    boom.done()
    live.flush()
    counted = [
        (e[3]["operation"], e[3]["status"]) for e in live.log if e[1].endswith("requests_total")
    ]
    assert counted == [("fwd_bwd", "200"), ("fwd_bwd", "422"), ("step", "500")]
    errors = [e[3] for e in live.log if e[1] == "arctic_rl_request_errors_total"]
    assert errors == [
        {"operation": "fwd_bwd", "status": "422", "code": "invalid_request"},
        {"operation": "step", "status": "500", "code": "internal_error"},
    ]
    assert len([e for e in live.log if e[0] == "observe"]) == 3
    assert live.gauges("arctic_rl_requests_in_flight")[(("operation", "fwd_bwd"),)] == 0.0
    # the same timing feeds the JSON metrics operation's totals
    totals = meter.totals()
    assert totals["requests"] == {"fwd_bwd": 2, "step": 1}
    assert totals["errors"] == {"fwd_bwd": 1, "step": 1}
    observed = sum(e[2] for e in live.log if e[0] == "observe")
    assert sum(totals["seconds"].values()) == pytest.approx(observed, abs=1e-5)


def test_jobs_by_state_set_every_pair_including_zeros(live):
    jobs = [
        SimpleNamespace(job_type="training", state=SimpleNamespace(value="running")),
        SimpleNamespace(job_type="sampling", state=SimpleNamespace(value="running")),
        SimpleNamespace(job_type="sampling", state=SimpleNamespace(value="failed")),
    ]
    server_metrics.record_jobs(jobs)
    kept = live.gauges("arctic_rl_jobs")
    assert len(kept) == len(server_metrics.JOB_TYPES) * len(server_metrics.JOB_STATES)
    assert kept[(("job_type", "sampling"), ("state", "failed"))] == 1.0
    assert kept[(("job_type", "log_prob"), ("state", "running"))] == 0.0


def test_a_sync_records_its_kind_bytes_seconds_and_version(live):
    server_metrics.record_sync(
        {"weight_version": 3, "bytes": 1000, "seconds": 0.2, "adapter": "a"}, ["sampling"]
    )
    live.flush()
    assert ("inc", "arctic_rl_weight_sync_bytes_total", 1000.0, {"kind": "adapter"}) in live.log
    assert live.gauges("arctic_rl_weight_version") == {
        (("job_type", "sampling"),): 3.0,
        (("job_type", "training"),): 3.0,
    }


def test_engine_calls_record_tokens_rates_step_figures_and_flops(live, monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_PEAK_FLOPS", "1e9")
    batch = SimpleNamespace(num_tokens=100)
    engine_metrics.record_call("training", "fwd_bwd", 0.5, (batch,), {"loss": 1.0}, parameters=1000)
    live.flush()
    assert (
        "inc",
        "arctic_rl_engine_tokens_total",
        100.0,
        {"job_type": "training", "operation": "fwd_bwd"},
    ) in live.log
    flops = live.gauges("arctic_rl_train_flops_per_second")
    assert list(flops.values()) == [pytest.approx(6 * 1000 * 100 / 0.5)]
    assert list(live.gauges("arctic_rl_train_mfu").values()) == [pytest.approx(1.2e-3)]
    engine_metrics.record_call("training", "step", 0.1, (), {"grad_norm": 0.7, "lr": 1e-3})
    assert live.gauges("arctic_rl_train_grad_norm") == {(("job_type", "training"),): 0.7}
    assert live.gauges("arctic_rl_train_learning_rate") == {(("job_type", "training"),): 1e-3}
    generated = [{"completions": [{"token_ids": [1, 2, 3]}, {"token_ids": [4]}]}]
    engine_metrics.record_call("sampling", "generate", 0.2, ([[1]], {}), generated)
    live.flush()
    assert (
        "inc",
        "arctic_rl_engine_tokens_total",
        4.0,
        {"job_type": "sampling", "operation": "generate"},
    ) in live.log
    assert any(e[1] == "arctic_rl_peak_memory_bytes" and e[2] > 0 for e in live.log)


def test_only_rank_zero_counts_a_training_batch(live):
    batch = SimpleNamespace(num_tokens=100)
    engine_metrics.record_call("training", "fwd_bwd", 0.5, (batch,), {}, counts_tokens=False)
    live.flush()
    assert not [e for e in live.log if e[1] == "arctic_rl_engine_tokens_total"]
    assert [e for e in live.log if e[1] == "arctic_rl_engine_call_duration_seconds"]


def test_discovery_lists_each_alive_nodes_metrics_port(tmp_path):
    nodes = [
        {"Alive": True, "NodeManagerAddress": "198.18.0.2", "MetricsExportPort": 50001},
        {"Alive": True, "NodeManagerAddress": "198.18.0.1", "MetricsExportPort": 50000},
        {"Alive": False, "NodeManagerAddress": "198.18.0.3", "MetricsExportPort": 50002},
    ]
    path = discovery.write_targets(tmp_path, nodes)
    assert path == tmp_path / discovery.TARGETS_FILE
    written = json.loads(path.read_text())
    assert written[0]["targets"] == ["198.18.0.1:50000", "198.18.0.2:50001"]
    assert written[0]["labels"]["run"] == tmp_path.name
    assert discovery.write_targets(tmp_path, nodes[2:]) is None


def test_the_prometheus_command_writes_its_config_or_names_what_is_missing(tmp_path):
    from arctic_platform.rl.errors import InvalidRequestError, MissingDependencyError

    with pytest.raises(MissingDependencyError, match="apt-get install prometheus"):
        prometheus.command(tmp_path, binary="no-such-prometheus-binary")
    with pytest.raises(InvalidRequestError, match="does not exist"):
        prometheus.command(tmp_path / "missing", binary="sh")
    argv = prometheus.command(tmp_path, binary="sh", port=19999)
    assert "--web.listen-address=127.0.0.1:19999" in argv
    config = (tmp_path / "prometheus" / "prometheus.yml").read_text()
    assert str(tmp_path / discovery.TARGETS_FILE) in config


def test_records_wait_in_buffers_until_a_flush_sums_counters_and_keeps_every_observation(live):
    for _ in range(3):
        live.inc("arctic_rl_train_steps_total", job_type="training")
        live.observe("arctic_rl_engine_call_duration_seconds", 0.1, job_type="t", operation="o")
    assert live.log == []  # nothing reaches Ray on the recording path
    live.flush()
    assert [e for e in live.log if e[0] == "inc"] == [
        ("inc", "arctic_rl_train_steps_total", 3.0, {"job_type": "training"})
    ]
    assert len([e for e in live.log if e[0] == "observe"]) == 3
    live.log.clear()
    live.flush()  # counters and histograms were handed over once; nothing new
    assert [e for e in live.log if e[0] != "set"] == []


def test_the_ray_stand_in_buffers_vllms_records_with_their_tags(live):
    from arctic_platform.rl.observe import deferred_metrics

    gauge = deferred_metrics.Gauge("vllm_num_requests_running", "", ("model_name", "ReplicaId"))
    gauge.set_default_tags({"ReplicaId": ""})
    gauge.set(2, tags={"model_name": "m"})
    counter = deferred_metrics.Counter("vllm_generation_tokens_total", "", ("model_name",))
    counter.inc(5, tags={"model_name": "m"})
    counter.inc(0, tags={"model_name": "m"})
    hist = deferred_metrics.Histogram("vllm_ttft_seconds", "", ("model_name",), [0.1, 1.0])
    hist.observe(0.3, tags={"model_name": "m"})
    with pytest.raises(ValueError, match="takes tags"):
        counter.inc(1, tags={"other": "x"})
    live.flush()
    assert (
        "set",
        "vllm_num_requests_running",
        2.0,
        {"ReplicaId": "", "model_name": "m"},
    ) in live.log
    assert ("inc", "vllm_generation_tokens_total", 5.0, {"model_name": "m"}) in live.log
    assert ("observe", "vllm_ttft_seconds", 0.3, {"model_name": "m"}) in live.log


def test_the_dashboard_render_draws_each_panel_from_range_queries(tmp_path):
    from arctic_platform.rl.observe import render

    asked: list[str] = []

    def fetch(path: str, params: dict) -> dict:
        assert path == "/api/v1/query_range" and "$__" not in params["query"]
        asked.append(params["query"])
        if "lora" in params["query"]:
            return {"data": {"result": []}}
        values = [[params["start"] + i, str(i)] for i in range(5)] + [[params["end"], "NaN"]]
        return {"data": {"result": [{"metric": {"job_type": "training"}, "values": values}]}}

    counts = render.render(fetch, tmp_path / "board.png", minutes=5, now=1_000_000.0)
    board = json.loads(render.DASHBOARD.read_text())
    titles = [p["title"] for p in render.panels(board)]
    assert list(counts) == titles and len(titles) >= 20
    assert counts["LoRA adapters live and parked, and swaps"] == 0
    assert all(n > 0 for t, n in counts.items() if "LoRA" not in t)
    assert len(asked) == sum(len(p["targets"]) for p in render.panels(board))
    assert (tmp_path / "board.png").stat().st_size > 10_000


def test_legends_follow_grafanas_format():
    from arctic_platform.rl.observe.render import legend, promql

    assert legend("{{job_type}} {{operation}}", {"job_type": "t", "operation": "o"}) == "t o"
    assert legend("", {"b": "2", "a": "1"}) == "a=1,b=2"
    assert promql("rate(x[$__rate_interval])") == "rate(x[1m])"


def test_a_failing_metric_record_never_fails_the_engine_call_and_is_logged_once(
    monkeypatch, caplog
):
    import logging
    from types import SimpleNamespace

    from arctic_platform.rl.server.worker import EngineWorker

    def broken(*args, **kwargs):
        raise ValueError("metric 'x' has no label 'y'")

    monkeypatch.setattr(engine_metrics, "record_call", broken)
    worker = EngineWorker("training", "deepspeed", {}, 0, 1, 0, "/tmp", {})
    worker.engine = SimpleNamespace(fwd_bwd=lambda batch: {"loss": 1.0})
    with caplog.at_level(logging.ERROR):
        assert worker.call("fwd_bwd", {"input_ids": [[1]]}) == {"loss": 1.0}
        assert worker.call("fwd_bwd", {"input_ids": [[1]]}) == {"loss": 1.0}
    logged = [r for r in caplog.records if "metrics of training's fwd_bwd" in r.getMessage()]
    assert len(logged) == 1 and "has no label 'y'" in logged[0].exc_text
