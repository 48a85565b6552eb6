"""bench.soak's pure parts: the least-squares slope, the second-half selection, the labels
of a fake process tree from a fake job table, and the summary of fake samples. No server."""

from __future__ import annotations

import math
import random

import pytest

from bench.soak import (
    KB,
    Labeller,
    Proc,
    growth_per_step,
    job_type_of,
    second_half,
    slope,
    summarize,
    worker_job_types,
)

SERVER = 100


def test_slope_of_a_linear_series_is_its_rate():
    xs = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert slope(xs, [5.0 + 3.5 * x for x in xs]) == pytest.approx(3.5)
    assert slope(xs, [7.0 - 2.0 * x for x in xs]) == pytest.approx(-2.0)


def test_slope_of_a_flat_noisy_series_is_near_zero():
    rng = random.Random(3)
    xs = [float(x) for x in range(0, 10_000, 50)]
    ys = [400e6 + rng.gauss(0.0, 1e6) for _ in xs]  # 400 MB, +-1 MB of noise
    # noise of 1 MB over 10 000 steps: far under a KB a step
    assert abs(slope(xs, ys)) < 0.05 * KB


def test_slope_needs_two_distinct_steps():
    assert math.isnan(slope([], []))
    assert math.isnan(slope([5.0], [1.0]))
    assert math.isnan(slope([5.0, 5.0], [1.0, 2.0]))
    with pytest.raises(ValueError):
        slope([1.0, 2.0], [1.0])


def test_second_half_keeps_the_points_at_or_past_the_middle_step():
    points = [(float(x), float(x)) for x in range(0, 201, 20)]
    assert [x for x, _ in second_half(points)] == [100.0, 120.0, 140.0, 160.0, 180.0, 200.0]
    assert second_half([]) == []
    # the middle of the range, not of the count: a run sampled densely at its start
    uneven = [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (3.0, 0.0), (10.0, 0.0)]
    assert [x for x, _ in second_half(uneven)] == [10.0]


def test_growth_per_step_ignores_a_warm_up_in_the_first_half():
    # +50 MB of warm-up over the first 100 steps, then +2 KB a step
    points = [
        (float(x), 50e6 * min(x, 100) / 100 + 2 * KB * max(0, x - 100)) for x in range(0, 201, 10)
    ]
    assert growth_per_step(points) == pytest.approx(2 * KB)


def _tree() -> list[Proc]:
    python = ("/usr/bin/python3",)
    ray = "/venv/lib/python3.11/site-packages/ray"
    return [
        Proc(SERVER, 1, "python3", (*python, "-m", "arctic_platform.rl.cli", "serve")),
        Proc(101, SERVER, "gcs_server", (f"{ray}/core/src/ray/gcs/gcs_server", "--x")),
        Proc(102, SERVER, "raylet", (f"{ray}/core/src/ray/raylet/raylet",)),
        Proc(103, SERVER, "python3", (*python, "-u", f"{ray}/_private/log_monitor.py", "--x")),
        Proc(104, 102, "python3", (*python, "-u", f"{ray}/dashboard/agent.py", "--x")),
        Proc(110, 102, "ray::EngineWork", ("ray::EngineWorker.generate", "", "")),
        Proc(111, 102, "ray::EngineWork", ("ray::EngineWorker",)),
        Proc(112, 102, "ray::EngineWork", ("ray::EngineWorker",)),
        Proc(113, 111, "python3", (*python, "-c", "from multiprocessing.spawn import x")),
        Proc(120, 102, "ray::IDLE", ("ray::IDLE",)),
        Proc(121, 102, "ray::IDLE", ("ray::IDLE",)),
    ]


JOBS = [  # what the server reports of each job (get_job / the job's description)
    {"job_id": 1, "job_type": "training", "worker_pids": [110]},
    {"job_id": 2, "job_type": "sampling", "worker_pids": [111]},
    {"job_id": 3, "job_type": "log_prob", "worker_pids": [112]},
]


def test_worker_job_types_maps_each_worker_pid_to_its_job_type():
    assert worker_job_types(JOBS) == {110: "training", 111: "sampling", 112: "log_prob"}
    assert worker_job_types([{"job_type": "training", "worker_pids": []}]) == {}


def test_every_process_is_labelled_by_its_role():
    labels = Labeller().label(_tree(), SERVER, worker_job_types(JOBS))
    assert labels == {
        SERVER: "server",
        101: "gcs_server",
        102: "raylet",
        103: "log_monitor",
        104: "dashboard_agent",
        110: "training worker",
        111: "sampling worker",
        112: "log_prob worker",
        113: "sampling worker child (python3)",
        120: "ray::IDLE",
        121: "ray::IDLE #2",
    }
    assert [job_type_of(labels[pid]) for pid in (110, 111, 112, 113, 120, SERVER)] == [
        "training",
        "sampling",
        "log_prob",
        "sampling",
        None,
        None,
    ]


def test_a_pid_keeps_its_label_and_a_new_one_gets_the_next_number():
    labeller = Labeller()
    tree = _tree()
    first = labeller.label(tree, SERVER, worker_job_types(JOBS))
    # 120 went away; a new idle worker appears: it does not take 120's label
    later = [p for p in tree if p.pid != 120] + [Proc(130, 102, "ray::IDLE", ("ray::IDLE",))]
    second = labeller.label(later, SERVER, worker_job_types(JOBS))
    assert second[121] == first[121] == "ray::IDLE #2"
    assert second[130] == "ray::IDLE #3"
    assert 120 not in second


def _samples() -> list[dict]:
    """A worker growing 3 KB a step, a flat server, a run dir growing 1 KB a step."""
    out = []
    for step in range(0, 101, 10):
        worker = 500e6 + 3 * KB * step
        server = 200e6
        out.append(
            {
                "step": step,
                "processes": {
                    "server": {"pid": 1, "rss": server, "pss": server},
                    "training worker": {"pid": 2, "rss": worker + 1e6, "pss": worker},
                },
                "total_rss": server + worker + 1e6,
                "total_pss": server + worker,
                "run_dir_bytes": 10_000 + 1000 * step,
                "ray_tmp_bytes": None,
            }
        )
    return out


def test_summarize_gives_each_process_job_type_and_the_total_its_growth():
    summary = summarize(_samples())
    assert summary["metric"] == "rss"
    worker = summary["processes"]["training worker"]
    assert worker["rss_kb_per_step"] == pytest.approx(3.0)
    assert worker["pss_kb_per_step"] == pytest.approx(3.0)
    assert "uss_kb_per_step" not in worker  # never read in these samples
    assert worker["rss_last_mb"] == pytest.approx(501.3)
    assert summary["processes"]["server"]["rss_kb_per_step"] == pytest.approx(0.0, abs=1e-9)
    assert worker["job_type"] == "training"
    assert summary["by_job_type"]["training"]["rss_kb_per_step"] == pytest.approx(3.0)
    assert set(summary["by_job_type"]) == {"training"}
    assert summary["total"]["rss_kb_per_step"] == pytest.approx(3.0)
    assert summary["total"]["pss_kb_per_step"] == pytest.approx(3.0)
    assert summary["dirs"]["run_dir_bytes"]["kb_per_step"] == pytest.approx(1.0)
    assert summary["dirs"]["run_dir_bytes"]["last_mb"] == pytest.approx(0.11)
    assert "ray_tmp_bytes" not in summary["dirs"]


def test_a_sample_without_pss_leaves_the_pss_figures_to_the_samples_that_have_it():
    samples = _samples()
    samples[7]["total_pss"] = None
    samples[7]["processes"]["training worker"]["pss"] = None
    summary = summarize(samples)
    assert summary["total"]["rss_kb_per_step"] == pytest.approx(3.0)
    assert summary["total"]["pss_kb_per_step"] == pytest.approx(3.0)
    assert summary["processes"]["training worker"]["pss_kb_per_step"] == pytest.approx(3.0)


def test_mappings_are_classified_by_their_smaps_name():
    from bench.soak import mapping_kind, rss_by_mapping

    assert mapping_kind("[heap]") == "heap"
    assert mapping_kind("") == "anon"
    assert mapping_kind("/usr/lib/libc.so.6") == "file"
    assert mapping_kind("/dev/shm/torch_1") == "other"
    assert mapping_kind("[stack]") == "stack"
    assert mapping_kind("[vdso]") == "other"
    import os

    mine = rss_by_mapping(os.getpid())
    assert mine is not None and mine["file"] > 0 and sum(mine.values()) > 0
    assert rss_by_mapping(2**22 + 12345) is None  # no such process


def test_file_growth_names_the_files_that_grew_most_and_counts_new_ones_whole(tmp_path):
    from bench.soak import file_growth, file_sizes

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "raylet.out").write_bytes(b"x" * 100)
    (tmp_path / "flat.txt").write_bytes(b"y" * 50)
    first = file_sizes(tmp_path)
    assert first == {"logs/raylet.out": 100, "flat.txt": 50}
    (tmp_path / "logs" / "raylet.out").write_bytes(b"x" * 400)
    (tmp_path / "logs" / "raylet.out.1").write_bytes(b"z" * 900)
    (tmp_path / "flat.txt").write_bytes(b"y" * 10)  # rotated: shrank
    grown = file_growth(first, file_sizes(tmp_path))
    assert grown == [("logs/raylet.out.1", 900), ("logs/raylet.out", 300)]
    assert file_sizes(tmp_path / "missing") == {}
