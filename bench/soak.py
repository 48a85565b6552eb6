"""Soak: N steps of the whole loop, with the memory of every process of the server sampled.

One server, started here (``arctic-rl serve --transport http|ray --num-gpus 3``), and one
client attached to it with one logical GPU per job (``colocate=False``). Each step:
``generate`` (prompts x samples x max_tokens) -> the old log-probs (``log_probs`` on the
log-prob job, or ``fwd_no_grad`` on the trainer when the run has no log-prob job) ->
``fwd_bwd`` (grpo) -> ``step`` -> ``sync_weights``.

Every ``every`` steps (and after the last) the resident memory of every process in the
server's tree is read (RSS and, where ``/proc/<pid>/smaps`` is readable, PSS and USS), each
process labelled by its role: ``server``, Ray's own processes by name (``gcs_server``,
``raylet``, ``log_monitor``, ``ray::IDLE`` ...), engine workers by their job type (the
``worker_pids`` the server reports for each job; a worker's own children too), plus the size
on disk of the run directory and of Ray's temp dir. Written: ``soak.json`` (every sample and
the summary) and ``soak.png`` (memory by process vs step) in ``out``. The figure is the
growth per step over the second half of the run: a least-squares slope, in KB (1000 bytes)
a step, per process, per job type and for the tree's total, of RSS (the headline), PSS and
USS (where ``smaps`` is readable).

On a 2-core CPU machine (tiny model, logical GPUs) a step at the defaults (8 x 4 x 16, all
three jobs, http) took 0.32-0.39 s: 2000 steps are 12-14 minutes with the start. Not in
``python -m bench``'s list; by hand::

    python -m bench.soak --steps 2000 --every 50 --out /tmp/soak
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import start_server, stop_server

KB = 1e3
KINDS = ("rss", "pss", "uss")
"""Resident set, proportional set (shared pages split among their sharers) and unique set
(pages no other process maps). The headline is RSS: PSS moves when any process of the
machine maps or unmaps the same files (a 200-step run over ray: PSS total -73 KB/step while
RSS +163), USS misses growth of shared memory; both are kept per process."""
MB = 1e6
JOB_TYPES = ("training", "sampling", "log_prob")
JOBS_CHOICES = ("all", "no-log-prob")
"""``all``: training, sampling and log-prob jobs (old log-probs from the log-prob job);
``no-log-prob``: training and sampling only (old log-probs from ``fwd_no_grad``)."""


# --- pure helpers (unit-tested) -------------------------------------------------------------


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (NaN with fewer than two distinct xs)."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} xs but {len(ys)} ys")
    n = len(xs)
    if n < 2:
        return math.nan
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return math.nan
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx


def second_half(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The ``(step, value)`` points whose step is at or past the middle of the steps' range."""
    if not points:
        return []
    first = min(x for x, _ in points)
    last = max(x for x, _ in points)
    middle = (first + last) / 2
    return [(x, y) for x, y in points if x >= middle]


def growth_per_step(points: Sequence[tuple[float, float]]) -> float:
    """Bytes a step over the second half of ``points`` (a least-squares slope)."""
    half = second_half(points)
    return slope([x for x, _ in half], [y for _, y in half])


@dataclass(frozen=True)
class Proc:
    """One process of the tree as read at a sample: who it is and its resident memory."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...] = ()
    rss: int = 0
    pss: int | None = None
    uss: int | None = None


def worker_job_types(jobs: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """``{worker pid: job type}`` from job descriptions with ``job_type`` and ``worker_pids``."""
    out: dict[int, str] = {}
    for job in jobs:
        for pid in job.get("worker_pids") or ():
            out[int(pid)] = str(job["job_type"])
    return out


def _script_role(cmdline: Sequence[str]) -> str | None:
    """A Python process's role from the script it runs (``.../dashboard/agent.py`` ->
    ``dashboard_agent``), or None when it runs no script."""
    for arg in cmdline[1:]:
        if arg.endswith(".py"):
            path = Path(arg)
            if path.stem in ("agent", "main", "__main__"):
                return f"{path.parent.name}_{path.stem}"
            return path.stem
    return None


def base_role(
    proc: Proc, server_pid: int, workers: Mapping[int, str], parents: Mapping[int, int]
) -> str:
    """The role of ``proc`` before numbering: server, a job type's worker (or a child of one),
    a Ray process by its name."""
    if proc.pid == server_pid:
        return "server"
    if proc.pid in workers:
        return f"{workers[proc.pid]} worker"
    seen: set[int] = set()
    parent = parents.get(proc.pid)
    while parent is not None and parent not in seen:
        if parent in workers:
            return f"{workers[parent]} worker child ({_process_name(proc)})"
        seen.add(parent)
        parent = parents.get(parent)
    return _process_name(proc)


def _process_name(proc: Proc) -> str:
    """Ray's title (``ray::IDLE``), a Python script's role, or the executable's name."""
    if proc.cmdline and proc.cmdline[0].startswith("ray::"):  # the full title; name() is cut
        return proc.cmdline[0].split()[0]
    if not proc.name.startswith("python"):
        return proc.name
    return _script_role(proc.cmdline) or proc.name


class Labeller:
    """Gives each pid one label for the whole run: its role, numbered (``#2``...) when another
    process already holds that role."""

    def __init__(self) -> None:
        self.labels: dict[int, str] = {}

    def label(
        self, procs: Sequence[Proc], server_pid: int, workers: Mapping[int, str]
    ) -> dict[int, str]:
        """The labels of ``procs`` (new pids get one, in pid order; known pids keep theirs)."""
        parents = {p.pid: p.ppid for p in procs}
        taken = set(self.labels.values())
        for proc in sorted(procs, key=lambda p: p.pid):
            if proc.pid in self.labels:
                continue
            role = base_role(proc, server_pid, workers, parents)
            label, n = role, 1
            while label in taken:
                n += 1
                label = f"{role} #{n}"
            self.labels[proc.pid] = label
            taken.add(label)
        return {p.pid: self.labels[p.pid] for p in procs}


def job_type_of(label: str) -> str | None:
    """The job type a label belongs to (its workers and their children), or None."""
    for job_type in JOB_TYPES:
        if label.startswith(f"{job_type} worker"):
            return job_type
    return None


def summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Growth per step over the second half (KB/step) per process, per job type and for the
    tree's total; first and last values in MB; the state dirs' sizes at start and end."""
    metric = "rss"
    processes: dict[str, dict[str, Any]] = {}
    labels = sorted({label for s in samples for label in s["processes"]})
    for label in labels:
        entry: dict[str, Any] = {}
        for kind in KINDS:
            points = [
                (float(s["step"]), float(s["processes"][label][kind]))
                for s in samples
                if label in s["processes"] and s["processes"][label].get(kind) is not None
            ]
            if not points:
                continue
            entry[f"{kind}_kb_per_step"] = growth_per_step(points) / KB
            entry[f"{kind}_first_mb"] = points[0][1] / MB
            entry[f"{kind}_last_mb"] = points[-1][1] / MB
        for kind in MAPPING_KINDS:
            points = [
                (float(s["step"]), float(s["processes"][label]["maps"][kind]))
                for s in samples
                if label in s["processes"] and "maps" in s["processes"][label]
            ]
            if len(points) >= 2:
                entry.setdefault("maps_kb_per_step", {})[kind] = growth_per_step(points) / KB
        entry["samples"] = sum(1 for s in samples if label in s["processes"])
        entry["job_type"] = job_type_of(label)
        processes[label] = entry
    by_job: dict[str, dict[str, Any]] = {}
    for job_type in JOB_TYPES:
        entry = {}
        for kind in KINDS:
            points = []
            for s in samples:
                values = [
                    v.get(kind)
                    for label, v in s["processes"].items()
                    if job_type_of(label) == job_type
                ]
                if values and all(v is not None for v in values):
                    points.append((float(s["step"]), float(sum(values))))
            if points:
                entry[f"{kind}_kb_per_step"] = growth_per_step(points) / KB
                entry[f"{kind}_first_mb"] = points[0][1] / MB
                entry[f"{kind}_last_mb"] = points[-1][1] / MB
        if entry:
            by_job[job_type] = entry
    total: dict[str, Any] = {}
    for kind in KINDS:
        points = [
            (float(s["step"]), float(s[f"total_{kind}"]))
            for s in samples
            if s.get(f"total_{kind}") is not None
        ]
        if points:
            total[f"{kind}_kb_per_step"] = growth_per_step(points) / KB
            total[f"{kind}_first_mb"] = points[0][1] / MB
            total[f"{kind}_last_mb"] = points[-1][1] / MB
    dirs = {}
    for key in ("run_dir_bytes", "ray_tmp_bytes"):
        points = [(float(s["step"]), float(s[key])) for s in samples if s.get(key) is not None]
        if points:
            dirs[key] = {
                "first_mb": points[0][1] / MB,
                "last_mb": points[-1][1] / MB,
                "kb_per_step": growth_per_step(points) / KB,
            }
    return {
        "metric": metric,
        "total": total,
        "by_job_type": by_job,
        "processes": processes,
        "dirs": dirs,
    }


# --- reading the machine --------------------------------------------------------------------


def read_tree(root_pid: int) -> list[Proc]:
    """Every live process of ``root_pid``'s tree with its RSS and (where readable) PSS."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for process in members:
        try:
            with process.oneshot():
                name, ppid, cmdline = process.name(), process.ppid(), tuple(process.cmdline())
                try:
                    info = process.memory_full_info()
                    rss = int(info.rss)
                    pss, uss = getattr(info, "pss", None), getattr(info, "uss", None)
                except psutil.AccessDenied:
                    rss, pss, uss = int(process.memory_info().rss), None, None
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        out.append(Proc(process.pid, ppid, name, cmdline, rss, _int(pss), _int(uss)))
    return out


MAPPING_KINDS = ("heap", "anon", "file", "stack", "other")


def mapping_kind(name: str) -> str:
    """The kind of one ``/proc/<pid>/smaps`` mapping from its name: ``[heap]`` (brk),
    ``anon`` (no name: mmap'd arenas, big tensors), ``file``, ``stack``, ``other``."""
    if name == "[heap]":
        return "heap"
    if not name:
        return "anon"
    if name.startswith("[stack"):
        return "stack"
    if name.startswith("/") and not name.startswith("/dev/shm"):
        return "file"
    return "other"


def rss_by_mapping(pid: int) -> dict[str, int] | None:
    """Resident bytes of ``pid`` by mapping kind (``MAPPING_KINDS``), or None if unreadable."""
    out = dict.fromkeys(MAPPING_KINDS, 0)
    kind = "other"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=5)
                if head and "-" in head[0] and not head[0].endswith(":"):
                    kind = mapping_kind(head[5].strip() if len(head) > 5 else "")
                elif head and head[0] == "Rss:":
                    out[kind] += int(head[1]) * 1024
    except OSError:
        return None
    return out


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def file_sizes(path: Path) -> dict[str, int]:
    """``{path relative to ``path``: bytes}`` of the files under ``path`` (empty if missing)."""
    out: dict[str, int] = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            try:
                out[os.path.relpath(full, path)] = os.lstat(full).st_size
            except OSError:
                continue  # removed while we walked
    return out


def file_growth(
    first: Mapping[str, int], last: Mapping[str, int], top: int = 8
) -> list[tuple[str, int]]:
    """The ``top`` files that grew most from ``first`` to ``last`` (new files count whole)."""
    grown = [(name, size - first.get(name, 0)) for name, size in last.items()]
    return sorted((g for g in grown if g[1] > 0), key=lambda g: -g[1])[:top]


def dir_bytes(path: Path) -> int | None:
    """Bytes of the files under ``path`` (not following links), or None when it is missing."""
    return sum(file_sizes(path).values()) if path.exists() else None


# --- the run -------------------------------------------------------------------------------


def _start(
    transport: str, run_dir: Path, port: int | None, log_max_mb: float
) -> subprocess.Popen[bytes]:
    """``arctic-rl serve`` over ``transport`` with three logical GPUs, answering once up; its
    log rotated as the local backend's is (``--log-file``), at ``log_max_mb``, 2 backups."""
    log = run_dir / "server.log"  # where the local backend puts it: counted in the state dir
    args = ["serve", "--transport", transport, "--run-dir", str(run_dir)]
    args += ["--num-gpus", "3", "--no-ray-auto-attach", "--log-file", str(log)]
    args += ["--log-max-mb", str(log_max_mb), "--log-backups", "2"]
    if transport == "http":
        args += ["--host", "127.0.0.1", "--port", str(port)]
        return start_server(args, health_url=f"http://127.0.0.1:{port}/health", log=log)
    address = run_dir / "ray_address"  # written once the server actor answers
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "arctic_platform.rl.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serve --transport ray exited:\n{log.read_text()[-3000:]}")
        if address.exists():
            return process
        time.sleep(0.5)
    stop_server(process)
    raise RuntimeError(f"serve --transport ray wrote no {address} in 600 s")


def _old_log_probs(
    client: Any, rows: list[tuple[list[int], list[int]]], log_prob_job: bool
) -> list[list[float]]:
    """Full-row old log-probs (0.0 over the prompt): from the log-prob job, or the trainer."""
    if log_prob_job:
        answer = client.log_probs([p for p, _ in rows], [c for _, c in rows])
        return [
            [0.0] * len(p) + [float(x) for x in out["log_probs"]]
            for (p, _), out in zip(rows, answer["outputs"], strict=True)
        ]
    return client.fwd_no_grad({"input_ids": [p + c for p, c in rows]})


def _one_step(
    client: Any, rng: random.Random, shape: Mapping[str, int], log_prob_job: bool
) -> None:
    """generate -> old log-probs -> fwd_bwd (grpo) -> step -> sync_weights."""
    prompts = [f"digits summing to {rng.randrange(3, 19)}:" for _ in range(shape["prompts"])]
    params = {"n": shape["samples"], "max_tokens": shape["max_tokens"], "temperature": 1.0}
    out = client.generate(prompts, params)
    rows = [
        (list(o["prompt_token_ids"]), list(c["token_ids"]))
        for o in out["outputs"]
        for c in o["completions"]
        if c["token_ids"]
    ]
    if rows:
        old = _old_log_probs(client, rows, log_prob_job)
        batch = {
            "input_ids": [p + c for p, c in rows],
            "loss_mask": [[0] * len(p) + [1] * len(c) for p, c in rows],
            "advantages": [rng.uniform(-1.0, 1.0) for _ in rows],
            "old_log_probs": old,
        }
        client.fwd_bwd(batch, loss_fn="grpo")
    client.step()
    client.sync_weights()


def _sample(
    step: int,
    server_pid: int,
    labeller: Labeller,
    workers: Mapping[int, str],
    run_dir: Path,
    ray_tmp: Path,
) -> dict[str, Any]:
    """One reading of the tree, the state dirs and this client process."""
    import psutil

    procs = read_tree(server_pid)
    ray_files = file_sizes(ray_tmp)  # one walk: the total is their sum
    labels = labeller.label(procs, server_pid, workers)
    entries = {
        labels[p.pid]: {"pid": p.pid, "rss": p.rss, "pss": p.pss, "uss": p.uss} for p in procs
    }
    for p in procs:
        if p.pid in workers or p.pid == server_pid:
            maps = rss_by_mapping(p.pid)
            if maps is not None:
                entries[labels[p.pid]]["maps"] = maps
    return {
        "step": step,
        "time": time.time(),
        "processes": entries,
        "total_rss": sum(p.rss for p in procs),
        "total_pss": _total(p.pss for p in procs),
        "total_uss": _total(p.uss for p in procs),
        "run_dir_bytes": dir_bytes(run_dir),
        "ray_tmp_bytes": sum(ray_files.values()) if ray_tmp.exists() else None,
        "ray_tmp_files": ray_files,
        "client_rss": int(psutil.Process().memory_info().rss),
    }


def _total(values: Iterable[int | None]) -> int | None:
    """The sum of ``values``, or None when any is unknown."""
    known = list(values)
    return None if any(v is None for v in known) else sum(v for v in known if v is not None)


def _workers(client: Any, job_types: Sequence[str]) -> dict[int, str]:
    """``{worker pid: job type}`` as the server reports its jobs now."""
    return worker_job_types(client.job_info(t) for t in job_types)


def run(
    transport: str = "http",
    steps: int = 2000,
    every: int = 50,
    prompts: int = 8,
    samples: int = 4,
    max_tokens: int = 16,
    jobs: str = "all",
    lora: int | None = None,
    out: str | None = None,
    seed: int = 0,
    log_max_mb: float = 1.0,
) -> dict[str, Any]:
    """Run the soak; write ``soak.json`` and ``soak.png`` under ``out``; return the report."""
    if jobs not in JOBS_CHOICES:
        raise ValueError(f"jobs must be one of {JOBS_CHOICES}, got {jobs!r}")
    if transport not in ("http", "ray"):
        raise ValueError(f"transport must be http or ray, got {transport!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.run_dirs import server_run_dir
    from arctic_platform.rl.testing import build_tiny_model, free_port

    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="arctic-bench-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["ARCTIC_RL_HOME"] = str(root / "home")
    host, port = ("127.0.0.1", free_port()) if transport == "http" else (None, None)
    # the client's local backend finds the server through this run dir (the ray transport's
    # address file, the token), so the server gets it too
    run_dir = server_run_dir(host, port, transport)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    log_prob_job = jobs == "all"
    job_types = [t for t in JOB_TYPES if log_prob_job or t != "log_prob"]
    training: dict[str, Any] = {"optimizer": {"lr": 1e-4}}
    if lora:
        training["lora"] = {"rank": lora}
    config = ArcticRLClientConfig(
        model_name=model,
        comm_protocol=transport,
        host=host,
        port=port,
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1 if log_prob_job else 0,
        colocate=False,
        ray_auto_attach=False,
        server_logs=False,
        startup_timeout=600,
        job_ready_timeout=600,
        training_config=training,
    )
    shape = {"prompts": prompts, "samples": samples, "max_tokens": max_tokens}
    settings = {"transport": transport, "steps": steps, "every": every, **shape}
    settings.update({"jobs": jobs, "lora": lora, "seed": seed, "model": model})
    settings["log_max_mb"] = log_max_mb
    server = _start(transport, run_dir, port, log_max_mb)
    ray_tmp = Path(os.environ.get("ARCTIC_RL_RAY_TMP", "/tmp")) / f"arctic-rl-ray-{server.pid}"
    labeller = Labeller()
    rng = random.Random(seed)
    readings: list[dict[str, Any]] = []
    step_seconds: list[float] = []
    client = None
    started = time.monotonic()
    try:
        client = ArcticRLClient(config, progress=False)
        workers = _workers(client, job_types)
        readings.append(_sample(0, server.pid, labeller, workers, run_dir, ray_tmp))
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            _one_step(client, rng, shape, log_prob_job)
            step_seconds.append(time.perf_counter() - t0)
            if step % every == 0 or step == steps:
                workers = _workers(client, job_types)
                readings.append(_sample(step, server.pid, labeller, workers, run_dir, ray_tmp))
                _progress(readings[-1], step_seconds)
    finally:
        if client is not None:
            client.close()
        stop_server(server)
    summary = summarize(readings)
    report = {
        "settings": settings,
        "run_dir": str(run_dir),
        "ray_tmp": str(ray_tmp),
        "seconds": time.monotonic() - started,
        "mean_step_seconds": sum(step_seconds) / len(step_seconds) if step_seconds else None,
        "labels": {str(pid): label for pid, label in labeller.labels.items()},
        "summary": summary,
        "samples": readings,
    }
    (root / "soak.json").write_text(json.dumps(report, indent=1))
    plot(readings, root / "soak.png", summary["metric"], settings)
    report["json"] = str(root / "soak.json")
    report["png"] = str(root / "soak.png")
    return report


def _progress(reading: Mapping[str, Any], step_seconds: Sequence[float]) -> None:
    """One line on stderr per sample: step, tree total, state dir, recent step time."""
    total = reading["total_rss"]
    recent = step_seconds[-20:]
    print(
        f"step {reading['step']}: tree {total / MB:.1f} MB RSS, "
        f"run dir {(reading['run_dir_bytes'] or 0) / MB:.2f} MB, "
        f"{sum(recent) / len(recent):.3f} s/step",
        file=sys.stderr,
        flush=True,
    )


def plot(
    samples: Sequence[Mapping[str, Any]], path: Path, metric: str, settings: Mapping[str, Any]
) -> None:
    """Memory by process vs step (one line each: absolute, and change since its first sample),
    the tree's total, and the state dirs' size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, absolute, change, bottom) = plt.subplots(
        4, 1, figsize=(12, 15), sharex=True, gridspec_kw={"height_ratios": [1, 1.8, 1.8, 0.8]}
    )
    steps = [s["step"] for s in samples]
    for kind in KINDS:
        values = [s.get(f"total_{kind}") for s in samples]
        if all(v is not None for v in values):
            top.plot(
                steps, [v / MB for v in values], marker=".", label=f"tree total ({kind.upper()})"
            )
    top.set_ylabel("MB")
    top.legend(fontsize=8)
    top.set_title(
        f"soak: {settings['transport']}, {settings['prompts']}x{settings['samples']}x"
        f"{settings['max_tokens']}, jobs {settings['jobs']}, lora {settings['lora']}"
    )
    labels = sorted({label for s in samples for label in s["processes"]})
    colours = plt.get_cmap("tab20")
    for index, label in enumerate(labels):
        xs, ys = [], []
        for s in samples:
            entry = s["processes"].get(label)
            if entry is None:
                continue
            value = entry[metric]
            xs.append(s["step"])
            ys.append(value / MB)
        style = {"marker": ".", "color": colours(index % 20), "label": label}
        style["linestyle"] = "-" if index < 20 else "--"
        absolute.plot(xs, ys, **style)
        change.plot(xs, [y - ys[0] for y in ys], **style)
    absolute.set_yscale("log")
    absolute.set_ylabel(f"MB ({metric.upper()}, log)")
    absolute.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    change.set_ylabel(f"MB since its first sample ({metric.upper()})")
    for key, name in (("run_dir_bytes", "run dir"), ("ray_tmp_bytes", "Ray temp dir")):
        points = [(s["step"], s[key] / MB) for s in samples if s.get(key) is not None]
        if points:
            bottom.plot(*zip(*points, strict=True), marker=".", label=name)
    bottom.set_ylabel("MB on disk")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def describe(report: Mapping[str, Any]) -> str:
    """The per-process growth table (RSS, PSS, USS), the total and the state dirs, as text."""
    summary = report["summary"]
    lines = ["growth over the second half (KB/step, least squares):"]
    width = max((len(label) for label in summary["processes"]), default=10)
    lines.append(f"  {'process':<{width}}  {'RSS':>9} {'PSS':>9} {'USS':>9}  RSS now")

    def figures(entry: Mapping[str, Any]) -> str:
        return " ".join(f"{entry.get(f'{k}_kb_per_step', math.nan):+9.2f}" for k in KINDS)

    for label, entry in sorted(summary["processes"].items()):
        last = entry.get("rss_last_mb", math.nan)
        lines.append(f"  {label:<{width}}  {figures(entry)}  {last:8.1f} MB")
    for job_type, entry in summary["by_job_type"].items():
        lines.append(f"  {'[' + job_type + ' job]':<{width}}  {figures(entry)}")
    total = summary["total"]
    lines.append(
        f"  {'TOTAL':<{width}}  {figures(total)}  {total.get('rss_first_mb', math.nan):.1f} -> "
        f"{total.get('rss_last_mb', math.nan):.1f} MB"
    )
    for label, entry in sorted(summary["processes"].items()):
        maps = entry.get("maps_kb_per_step")
        if maps:
            parts = ", ".join(f"{kind} {value:+.2f}" for kind, value in maps.items())
            lines.append(f"  {label} RSS by mapping (KB/step): {parts}")
    for key, entry in summary["dirs"].items():
        lines.append(
            f"  {key}: {entry['first_mb']:.2f} MB at start, {entry['last_mb']:.2f} MB at end "
            f"({entry['kb_per_step']:+.2f} KB/step)"
        )
    samples = report.get("samples") or []
    if len(samples) >= 2 and "ray_tmp_files" in samples[-1]:
        middle, last = samples[len(samples) // 2], samples[-1]
        grown = file_growth(middle.get("ray_tmp_files") or {}, last["ray_tmp_files"])
        span = max(last["step"] - middle["step"], 1)
        lines.append(f"  Ray temp dir, files that grew over steps {middle['step']}-{last['step']}:")
        for name, size in grown:
            now = last["ray_tmp_files"][name]
            lines.append(f"    {name}: {size / KB / span:+.3f} KB/step, {now / MB:.2f} MB now")
    if report.get("mean_step_seconds") is not None:
        lines.append(
            f"  mean step {report['mean_step_seconds']:.3f} s, run {report['seconds']:.0f} s"
        )
    return "\n".join(lines)


def rows(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The markdown rows of ``python -m bench``: the tree's total growth, then each job type's."""
    summary = report["summary"]
    metric = summary["metric"]
    s = report["settings"]
    what = (
        f"{s['steps']} steps over {s['transport']}, {s['prompts']}x{s['samples']}x{s['max_tokens']}"
    )
    total = summary["total"]
    dirs = summary["dirs"].get("run_dir_bytes", {})
    out = [
        (
            f"soak: server tree's total {metric.upper()} ({what})",
            f"{total[f'{metric}_kb_per_step']:+.1f} KB/step over the 2nd half",
            f"{total[f'{metric}_first_mb']:.0f} -> {total[f'{metric}_last_mb']:.0f} MB; "
            f"run dir {dirs.get('first_mb', math.nan):.1f} -> "
            f"{dirs.get('last_mb', math.nan):.1f} MB",
        )
    ]
    for job_type, entry in summary["by_job_type"].items():
        out.append(
            (
                f"soak: {job_type} job's workers ({what})",
                f"{entry[f'{metric}_kb_per_step']:+.1f} KB/step over the 2nd half",
                f"{entry[f'{metric}_first_mb']:.0f} -> {entry[f'{metric}_last_mb']:.0f} MB",
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the flags are ``run``'s keyword arguments."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--transport", choices=("http", "ray"), default="http")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="sample the tree every K steps")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--jobs",
        choices=JOBS_CHOICES,
        default="all",
        help="all: training+sampling+log-prob (log_probs); no-log-prob: fwd_no_grad instead",
    )
    parser.add_argument("--lora", type=int, metavar="RANK", help="train a LoRA adapter of RANK")
    parser.add_argument("--out", help="where soak.json, soak.png and the run dir go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--log-max-mb",
        type=float,
        default=1.0,
        help="the server log rotates past this size, 2 backups kept (default 1 MB, so a long "
        "run shows the state dir's bound)",
    )
    args = parser.parse_args(argv)
    report = run(**vars(args))
    print(describe(report))
    print(f"wrote {report['json']} and {report['png']}")
    return 0


if __name__ == "__main__":  # pragma: no cover - a manual run
    sys.exit(main())
