"""One cookbook-style RL step through the Tinker front-end vs the same work via ArcticRLClient.

A step: sample (``prompts`` x ``group`` completions) → forward_backward with Tinker's
``importance_sampling`` (per-token log-probs back) → optim_step (AdamParams) →
save_weights_for_sampler (a weight sync) and a sampler on it. The Tinker side is the real
``tinker`` SDK against ``arctic-rl serve --transport tinker``; the other side is
``ArcticRLClient`` over http with the same loss plugin (``tinker.importance_sampling``), the
same batch and the same AdamW settings. Both servers stay up; each round times one step on
each side, in alternating order; the figure is the median of the rounds' ratios, with their
spread, each part of the step and the load average (goal: ratio <= 1.10).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.servers import loopback_config, start_server, stop_server
from bench.timing import Laps, Paired, Side, cpu_counter, paired

TOKEN = "tml-bench-key"
PHASES = ("sample", "build", "fwd_bwd", "optim", "sync")
"""Parts of a step, timed on each side (``build``: the client's batch, no server work)."""
ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}


def _start_tinker_server(
    home: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    from arctic_platform.rl.testing import free_port

    port = free_port()
    (home / "token").write_text(TOKEN)
    args = ["serve", "--transport", "tinker", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--token-file", str(home / "token"), "--run-dir", str(home / "run")]
    args += ["--num-gpus", "1", "--no-ray-auto-attach"]
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        args,
        health_url=f"{url}/api/v1/healthz",
        log=home / "server.log",
        env={**os.environ, "ARCTIC_RL_HOME": str(home), **(env or {})},
    )
    return process, url


def _rows(prompt: list[int], tokens: list[int], logprobs: list[float], adv: float) -> dict:
    """One sampled completion as a Tinker-style datum's parts (shifted inputs and targets)."""
    full = prompt + tokens
    n = len(full) - 1
    return {
        "input": full[:-1],
        "target": full[1:],
        "logprobs": [0.0] * (len(prompt) - 1) + list(logprobs),
        "advantages": [0.0] * (len(prompt) - 1) + [adv] * len(tokens),
        "n": n,
    }


def _advantages(groups: list[list[list[int]]]) -> list[list[float]]:
    """Group-centred rewards (reward: share of digit tokens, any fixed function will do)."""
    out = []
    for group in groups:
        rewards = [sum(1 for t in c if 10 <= t < 20) / max(len(c), 1) for c in group]
        mean = sum(rewards) / len(rewards)
        out.append([r - mean for r in rewards])
    return out


def _tinker_step(
    training: Any, sampler: Any, prompts: list[list[int]], params: Any
) -> tuple[Any, dict[str, float]]:
    """One step through the tinker SDK: the next sampler and the seconds of each part."""
    import tinker

    laps = Laps()
    futures = [
        sampler.sample(tinker.ModelInput.from_ints(p), params["group"], params["sp"])
        for p in prompts
    ]
    results = [f.result() for f in futures]
    laps.mark("sample")
    groups = [[list(s.tokens) for s in r.sequences] for r in results]
    advs = _advantages(groups)
    data = []
    for prompt, result, adv in zip(prompts, results, advs, strict=True):
        for seq, a in zip(result.sequences, adv, strict=True):
            r = _rows(prompt, list(seq.tokens), list(seq.logprobs), a)
            data.append(
                tinker.Datum(
                    model_input=tinker.ModelInput.from_ints(r["input"]),
                    loss_fn_inputs={
                        "target_tokens": tinker.TensorData(
                            data=r["target"], dtype="int64", shape=[r["n"]]
                        ),
                        "logprobs": tinker.TensorData(
                            data=r["logprobs"], dtype="float32", shape=[r["n"]]
                        ),
                        "advantages": tinker.TensorData(
                            data=r["advantages"], dtype="float32", shape=[r["n"]]
                        ),
                    },
                )
            )
    laps.mark("build")
    fwd = training.forward_backward(data, "importance_sampling")
    opt = training.optim_step(tinker.AdamParams(**ADAM))
    fwd.result()
    laps.mark("fwd_bwd")
    opt.result()
    laps.mark("optim")
    sampler = training.save_weights_and_get_sampling_client().result()
    laps.mark("sync")
    return sampler, laps.seconds


def _arctic_step(client: Any, prompts: list[list[int]], params: Any) -> dict[str, float]:
    """The same step through ArcticRLClient: the seconds of each part."""
    laps = Laps()
    outputs = client.generate(
        prompts,
        {
            "n": params["group"],
            "max_tokens": params["max_tokens"],
            "temperature": 1.0,
        },
    )["outputs"]
    laps.mark("sample")
    groups = [[c["token_ids"] for c in out["completions"]] for out in outputs]
    advs = _advantages(groups)
    batch: dict[str, list[list[Any]]] = {
        "input_ids": [],
        "target_tokens": [],
        "old_log_probs": [],
        "advantages": [],
        "loss_mask": [],
    }
    for prompt, out, adv in zip(prompts, outputs, advs, strict=True):
        for c, a in zip(out["completions"], adv, strict=True):
            r = _rows(prompt, c["token_ids"], c["logprobs"], a)
            batch["input_ids"].append([*r["input"], r["target"][-1]])
            batch["target_tokens"].append([0, *r["target"]])
            batch["old_log_probs"].append([0.0, *r["logprobs"]])
            batch["advantages"].append([0.0, *r["advantages"]])
            batch["loss_mask"].append([0.0] + [1.0] * r["n"])
    laps.mark("build")
    client.fwd_bwd(batch, "tinker.importance_sampling", return_log_probs=True)
    laps.mark("fwd_bwd")
    client.step(
        ADAM["learning_rate"],
        beta1=ADAM["beta1"],
        beta2=ADAM["beta2"],
        eps=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
        grad_clip_norm=0.0,
    )
    laps.mark("optim")
    client.sync_weights()
    laps.mark("sync")
    return laps.seconds


def _paired(
    sides: dict[str, Callable[[], dict[str, float]]],
    repeats: int,
    servers: dict[str, int | None],
    warmup: int = 5,
) -> Paired:
    """``repeats`` rounds of one step each side, the order alternating (AB, BA, ...).

    Each round's ratio a/b is a pair measured back to back, so load that changes slowly
    moves both sides of a pair alike; the median of the pairs' ratios is the figure. CPU
    seconds of this process (the client side: the SDK or ArcticRLClient) and of each side's
    server process (the front-end, not the engines) are kept too: unlike wall time they
    hardly depend on the load. Fresh engine workers run their first calls slowly (see the
    transport bench), hence ``warmup`` untimed steps a side. A side returns its parts' seconds.
    """
    return paired(
        {
            name: Side(fn, counters={"server_cpu": cpu_counter(servers.get(name))}, measure=dict)
            for name, fn in sides.items()
        },
        repeats,
        warmup,
    )


def _round_records(timing: Paired) -> list[dict[str, Any]]:
    """Each round as recorded: per side its total, parts and CPU seconds; the ratio a/b."""
    a, b = timing.sides
    rounds: list[dict[str, Any]] = []
    for r in timing.rounds:
        round_: dict[str, Any] = {}
        for name in r.order:
            s = r.samples[name][0]
            round_[name] = {
                "total": s.wall,
                **s.figures,
                "client_cpu": s.cpu,
                "server_cpu": s.counters["server_cpu"],
            }
        round_["ratio"] = round_[a]["total"] / round_[b]["total"]
        round_["load_1min"] = r.load_1min
        rounds.append(round_)
    return rounds


def run(prompts: int = 8, group: int = 4, max_tokens: int = 16, repeats: int = 9) -> dict:
    """Median seconds of one step through each front-end, the median of paired ratios."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import tinker

    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.testing import build_tiny_model, free_port

    root = Path(tempfile.mkdtemp(prefix="arctic-bench-tinker-"))
    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / "tiny"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    words = ["12 + 30 =", "digits summing to 7:", "write a number", "7 + 5 ="]
    batch_prompts = [
        tok.encode(words[i % len(words)] + " " * (i // len(words))) for i in range(prompts)
    ]
    params = {
        "group": group,
        "max_tokens": max_tokens,
        "sp": tinker.SamplingParams(max_tokens=max_tokens, temperature=1.0),
    }
    (root / "tinker").mkdir()
    server, url = _start_tinker_server(root / "tinker")
    os.environ["ARCTIC_RL_HOME"] = str(root / "arctic")
    client = None
    try:
        service = tinker.ServiceClient(base_url=url, api_key=TOKEN)
        training = service.create_lora_training_client(base_model=model, rank=8).result()
        state = {"sampler": training.save_weights_and_get_sampling_client().result()}

        def tinker_step() -> dict[str, float]:
            state["sampler"], parts = _tinker_step(
                training, state["sampler"], batch_prompts, params
            )
            return parts

        config = loopback_config(
            model,
            free_port(),
            training_gpus=1,
            sampling_gpus=1,
            colocate=True,
            training_config={"lora": {"rank": 8}},  # the same work: the SDK's model is rank 8
        )
        client = ArcticRLClient(config, progress=False)
        client.sync_weights()
        pid_files = sorted((root / "arctic").rglob("server.pid"))
        servers = {  # each side's server process, for its CPU seconds
            "tinker": server.pid,
            "arctic_rl_client": int(pid_files[0].read_text()) if len(pid_files) == 1 else None,
        }
        load_start = os.getloadavg()
        timing = _paired(
            {
                "tinker": tinker_step,
                "arctic_rl_client": lambda: _arctic_step(client, batch_prompts, params),
            },
            repeats,
            servers,
        )
        load_end = os.getloadavg()
    finally:
        if client is not None:
            client.shutdown()
        stop_server(server)
    ratios = timing.ratios("tinker", "arctic_rl_client")
    sides = ("tinker", "arctic_rl_client")
    return {
        "workload": {"prompts": prompts, "group": group, "max_tokens": max_tokens},
        "method": (
            "one step each side per round, the order alternating (AB, BA, ...), both servers "
            "up; ratio: median over rounds of tinker/arctic_rl_client"
        ),
        "repeats": repeats,
        "seconds": {side: timing.median(side) for side in sides},
        "phases_median": {
            side: {name: timing.median(side, name) for name in PHASES} for side in sides
        },
        "cpu_median": {
            side: {
                "client_cpu": timing.median(side, "cpu"),
                "server_cpu": timing.median(side, "server_cpu"),
            }
            for side in sides
        },
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "load_average_start": list(load_start),
        "load_average_end": list(load_end),
        "rounds": _round_records(timing),
        "goal": 1.10,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Markdown-table rows: (benchmark, measured, ratio)."""
    w, s = report["workload"], report["seconds"]
    load = (report["load_average_start"][0], report["load_average_end"][0])
    return [
        (
            f"cookbook-style RL step via the tinker SDK vs ArcticRLClient "
            f"({w['prompts']}x{w['group']} samples, {w['max_tokens']} tokens, "
            f"{report['repeats']} alternating pairs)",
            f"{s['tinker'] * 1000:.0f} ms vs {s['arctic_rl_client'] * 1000:.0f} ms "
            f"(load {load[0]:.1f} -> {load[1]:.1f})",
            f"{report['ratio']:.3f} (pairs {report['ratio_min']:.2f}-{report['ratio_max']:.2f})",
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(json.dumps(run(repeats=args.repeats), indent=2))
