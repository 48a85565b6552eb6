"""Three Tinker LoRA models on one base model share one LoRA pool (issue 25), through the real
``tinker`` SDK: exactly one training and one sampling job serve them, each model's sampler
answers with its own trainer's log-probs (and not the others'), a model more costs host memory
of the order of an adapter, not of two engine processes, and a finished session's adapter
leaves the pool while the other models go on.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SENTENCES = ["12 + 30 = 42", "the sum of digits", "write a number 123"]
PROBE = "7 + 5 = 12 and the sum"
MB = 1 << 20


def _datum(tokens):
    import tinker

    targets = tokens[1:]
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
            "weights": tinker.TensorData(
                data=[1.0] * len(targets), dtype="float32", shape=[len(targets)]
            ),
        },
    )


def _jobs(tinker_server) -> dict[str, int]:
    """Live jobs of the server by type, from its job table (snapshot plus journal)."""
    from arctic_platform.rl.server.job_table import load_table

    table = load_table(tinker_server.log.parent / "server")
    assert table is not None
    live = ("pending", "placing", "initializing", "running")
    counts: dict[str, int] = {}
    for job in table.jobs:
        if job.state in live:
            counts[job.job_type] = counts.get(job.job_type, 0) + 1
    return counts


def _tree_pss(pid: int) -> int:
    """Proportional set size of a process and all its descendants (shared pages split)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _settled_pss(pid: int) -> int:
    """The tree's PSS once two readings a second apart agree within 2 MB (at most 20 s)."""
    last = _tree_pss(pid)
    for _ in range(20):
        time.sleep(1.0)
        now = _tree_pss(pid)
        if abs(now - last) < 2 * MB:
            return now
        last = now
    return last


def _lora_metrics(run_dir: Path, want_swaps: float, timeout: float = 60) -> dict[str, float]:
    """The pools' adapters live and parked and the swaps, read from the Ray metrics endpoints
    the server's discovery file lists, once the swaps reach ``want_swaps``."""
    import json
    import re

    import httpx

    from arctic_platform.rl.observe.discovery import TARGETS_FILE

    deadline = time.monotonic() + timeout
    while True:
        seen = {"live": 0.0, "parked": 0.0, "swaps": 0.0}
        targets = json.loads((run_dir / TARGETS_FILE).read_text())[0]["targets"]
        for target in targets:
            text = httpx.get(f"http://{target}/metrics", timeout=10, trust_env=False).text
            for line in text.splitlines():
                state = re.match(r'ray_arctic_rl_lora_adapters\{.*state="(\w+)".*\} (\S+)', line)
                if state:
                    seen[state.group(1)] += float(state.group(2))
                elif line.startswith("ray_arctic_rl_lora_swaps_total{"):
                    seen["swaps"] += float(line.rsplit(" ", 1)[1])
        if seen["swaps"] >= want_swaps or time.monotonic() > deadline:
            return seen
        time.sleep(1.0)


def test_three_models_share_one_pool_and_each_sampler_serves_its_own_adapter(tinker_server):
    import tinker

    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.token)
    other = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.token)
    try:
        clients, memory = [], []
        adam = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
        for seed, owner in ((1, service), (2, service), (3, other)):
            client = owner.create_lora_training_client(
                base_model=tinker_server.model, rank=8, seed=seed
            ).result(timeout=900)
            clients.append(client)
            # what a model costs once it is in use: its optimizer state after a step, and its
            # adapter loaded and sampled in the pool's sampler
            tokens = client.get_tokenizer().encode(SENTENCES[seed - 1])
            client.forward_backward([_datum(tokens)], "cross_entropy")
            client.optim_step(adam).result(timeout=600)
            warm = client.save_weights_and_get_sampling_client(name=f"warm-{seed}")
            warm.compute_logprobs(tinker.ModelInput.from_ints(tokens)).result(timeout=600)
            memory.append(_settled_pss(tinker_server.process.pid))
        assert _jobs(tinker_server) == {"training": 1, "sampling": 1}
        per_model = (memory[2] - memory[0]) / 2
        print(f"host PSS per extra trained and sampled LoRA model: {per_model / MB:.1f} MB")
        print(f"(tree PSS after each model: {[round(m / MB, 1) for m in memory]} MB)")
        assert per_model < 50 * MB

        tok = clients[0].get_tokenizer()
        for _ in range(3):  # the models' steps interleave on the pool's one training job
            for client, sentence in zip(clients, SENTENCES, strict=True):
                client.forward_backward([_datum(tok.encode(sentence))], "cross_entropy")
                client.optim_step(adam).result(timeout=600)
        lora = _lora_metrics(tinker_server.log.parent / "server", want_swaps=6)
        # one pool: the three models' adapters and the training job's own default one
        assert lora["live"] == 1 and lora["parked"] == 3, lora
        assert lora["swaps"] >= 6, lora  # each step of another model swaps its adapter in
        probe = tok.encode(PROBE)
        trainers = []
        for client in clients:
            out = client.forward([_datum(probe)], "cross_entropy").result(timeout=600)
            trainers.append(out.loss_fn_outputs[0]["logprobs"].to_numpy())
        served = []
        for i, client in enumerate(clients):
            path = client.save_weights_for_sampler(f"pool-{i}").result(timeout=600).path
            sampler = service.create_sampling_client(model_path=path)
            lps = sampler.compute_logprobs(tinker.ModelInput.from_ints(probe)).result(timeout=600)
            served.append(np.asarray(lps[1:], dtype=np.float64))
        for i, mine in enumerate(served):
            for j, trainer in enumerate(trainers):
                gap = float(np.max(np.abs(mine - trainer)))
                if i == j:
                    assert gap <= 1e-4, (i, gap)
                else:
                    assert gap > 1e-3, (i, j, gap)

        other.close("success").result(timeout=300)  # model 3's adapter leaves; the pool stays
        assert _jobs(tinker_server) == {"training": 1, "sampling": 1}
        again = clients[0].forward([_datum(probe)], "cross_entropy").result(timeout=600)
        assert np.max(np.abs(again.loss_fn_outputs[0]["logprobs"].to_numpy() - trainers[0])) == 0
    finally:
        service.close("success").result(timeout=300)
    deadline = time.monotonic() + 120
    while _jobs(tinker_server) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert _jobs(tinker_server) == {}  # the last model gone, the pool's jobs went with it
