"""The configuration matrix's runner: the whole loop on one row, on servers shared by rows.

``MatrixRunner.run(row)`` runs generate, log-probs, a step, a weight sync, save, a second
process reconnecting and a load on one row, against servers shared by the rows of one backend
and transport; a failed check is a failed row (``RowResult``), never an exception.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.matrix_plan import Row, row_config
from bench.servers import start_server, stop_server

# Agreement bounds between the trainer's log-probs and the sampler's / log-prob job's.
FP32_LOGPROB_BOUND = 1e-3
# bf16: the trainer computes in bf16 while vLLM-CPU serves fp32 on the same (bf16-valued)
# weights. Measured on this machine's pairwise rows: 0.0023-0.0047 (step 0 and after a sync);
# the bound leaves 4x room and still catches a sampler serving stale weights (0.086-0.107 after
# one step at lr 1e-3, the tied-head bug this matrix found).
BF16_LOGPROB_BOUND = 0.02
PROMPTS = ["12 + 30 =", "the sum of digits", "write a number"]
PLATFORM_TOKEN = "matrix-platform-token-0123456789abcdef"
FAST_POLL = {
    "ARCTIC_RL_DSS_POLL_INITIAL": "0.05",
    "ARCTIC_RL_DSS_POLL_FACTOR": "1.25",
    "ARCTIC_RL_DSS_POLL_MAX": "0.5",
}


class RowFailure(AssertionError):
    """A check of the whole loop failed on a row."""


@dataclass
class RowResult:
    """What one row's run showed."""

    row: str
    passed: bool
    seconds: float
    error: str = ""
    checks: dict[str, Any] = field(default_factory=dict)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RowFailure(what)


def _rows_of(outputs: list[dict[str, Any]]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    rows, masks, plens = [], [], []
    for out in outputs:
        prompt = list(out["prompt_token_ids"])
        for completion in out["completions"]:
            rows.append(prompt + list(completion["token_ids"]))
            masks.append([0] * len(prompt) + [1] * len(completion["token_ids"]))
            plens.append(len(prompt))
    return rows, masks, plens


def _max_diff(a: Iterable[float], b: Iterable[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def _agreement(client: Any, gen: dict[str, Any]) -> tuple[float, float]:
    """Max |trainer - sampler| and |trainer - log-prob job| over the sampled tokens."""
    rows, _, plens = _rows_of(gen["outputs"])
    trainer = client.fwd_no_grad({"input_ids": rows})
    sampled = [c["logprobs"] for o in gen["outputs"] for c in o["completions"]]
    lp = client.log_probs(
        [r[:p] for r, p in zip(rows, plens, strict=True)],
        [r[p:] for r, p in zip(rows, plens, strict=True)],
    )
    vs_sampler = max(_max_diff(t[p:], s) for t, s, p in zip(trainer, sampled, plens, strict=True))
    vs_log_prob = max(
        _max_diff(t[p:], o["log_probs"])
        for t, o, p in zip(trainer, lp["outputs"], plens, strict=True)
    )
    return vs_sampler, vs_log_prob


_RECONNECT = """
import json, sys
from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
cfg = ArcticRLClientConfig.model_validate_json(open(sys.argv[1]).read())
batch = json.loads(open(sys.argv[2]).read())
c = ArcticRLClient(cfg, progress=False)
idle = c.step()
m = c.fwd_bwd(batch, loss_fn="cross_entropy")
s = c.step()
c.close()
print("RESULT " + json.dumps({"idle": [idle["applied"], idle["global_step"]],
                              "loss": m["loss"], "step": s["global_step"],
                              "applied": s["applied"]}))
"""


class MatrixRunner:
    """Runs rows against servers shared by the rows of one (backend, transport)."""

    def __init__(self, work_dir: Path, *, gpus: int = 4) -> None:
        self.work_dir = Path(work_dir)
        self.gpus = gpus
        self.models: dict[tuple[str, bool], str] = {}
        self._local: dict[str, tuple[Any, int | None]] = {}
        self._platform: subprocess.Popen[bytes] | None = None
        self._platform_port: int | None = None
        self._state_file: Path | None = None

    # --- rows side by side ------------------------------------------------------------------

    def prepare(self, rows: Iterable[Row]) -> None:
        """Build every model and start every server ``rows`` need, so that they can then run
        side by side (``run_in_process``); the servers stay this runner's to stop."""
        rows = list(rows)
        for row in rows:
            self.model(row.arch, row.tied)
        for row in rows:
            if row.backend == "dss-platform":
                self._platform_server()
            else:
                self._local_server(row.transport)
        state = {
            "work_dir": str(self.work_dir),
            "gpus": self.gpus,
            "models": [[arch, tied, path] for (arch, tied), path in self.models.items()],
            "local": {t: [h.model_dump_json(), port] for t, (h, port) in self._local.items()},
            "platform_port": self._platform_port,
        }
        self._state_file = self.work_dir / "runner-state.json"
        self._state_file.write_text(json.dumps(state))

    @classmethod
    def from_state(cls, path: Path) -> MatrixRunner:
        """A runner in a row's own process, on the models and servers ``prepare`` made."""
        from arctic_platform.rl.config import ArcticRLClientConfig

        state = json.loads(Path(path).read_text())
        runner = cls(Path(state["work_dir"]), gpus=state["gpus"])
        runner.models = {(arch, tied): model for arch, tied, model in state["models"]}
        runner._local = {
            t: (ArcticRLClientConfig.model_validate_json(h), port)
            for t, (h, port) in state["local"].items()
        }
        runner._platform_port = state["platform_port"]
        return runner

    def run_in_process(self, row: Row, timeout: float = 1800) -> RowResult:
        """``run(row)`` in a process of its own (its own Ray driver and environment), so two
        rows can run at once; ``prepare`` must have started the servers."""
        if self._state_file is None:
            raise RuntimeError("prepare() the rows before running them in processes")
        args = [sys.executable, "-m", "bench.matrix_runner", str(self._state_file), row.id]
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
            )
        except subprocess.TimeoutExpired as exc:
            return RowResult(row=row.id, passed=False, seconds=timeout, error=f"timeout: {exc}")
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            error = f"row process exited {done.returncode}: {done.stderr[-2000:]}"
            return RowResult(row=row.id, passed=False, seconds=0.0, error=error)
        return RowResult(**json.loads(lines[-1][len("RESULT ") :]))

    # --- shared pieces ---------------------------------------------------------------------

    def model(self, arch: str, tied: bool) -> str:
        """The tiny model of ``arch`` with or without tied embeddings (built once)."""
        from arctic_platform.rl.testing import build_tiny_model

        key = (arch, tied)
        if key not in self.models:
            path = self.work_dir / "models" / f"{arch}-{'tied' if tied else 'untied'}"
            self.models[key] = str(build_tiny_model(path, arch, tie_word_embeddings=tied))
        return self.models[key]

    def _local_server(self, transport: str) -> int | None:
        """Start (once) a local-backend server for ``transport`` with room for any row."""
        if transport in self._local:
            return self._local[transport][1]
        from arctic_platform.rl.config import ArcticRLClientConfig
        from arctic_platform.rl.network import free_port
        from arctic_platform.rl.plugins import get_registry

        port = free_port("127.0.0.1") if transport == "http" else None
        holder = ArcticRLClientConfig.model_validate(
            {
                **row_config(Row(transport=transport), "unused", port=port),
                "training_gpus": self.gpus - 2,
            }
        )
        backend = get_registry().get("backend", "local").create()
        backend.start(holder).close()  # launches the server and waits until it is healthy
        self._local[transport] = (holder, port)
        return port

    def _platform_server(self) -> int:
        """Start (once) an ``arctic-rl platform serve`` for the dss-platform rows."""
        if self._platform_port is not None:
            return self._platform_port
        from arctic_platform.rl.network import free_port

        root = self.work_dir / "platform"
        root.mkdir(parents=True, exist_ok=True)
        tokens = root / "tokens.json"
        tokens.write_text(json.dumps({"matrix": PLATFORM_TOKEN}))
        port = free_port("127.0.0.1")
        args = ["platform", "serve", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--tokens", str(tokens), "--run-dir", str(root / "run")]
        args += ["--num-gpus", str(self.gpus)]
        self._platform = start_server(
            args,
            health_url=f"http://127.0.0.1:{port}/health",
            log=root / "platform.log",
            timeout=300,
        )
        self._platform_port = port
        return port

    def close(self) -> None:
        """Stop every server this runner started."""
        from arctic_platform.rl.plugins import get_registry

        for holder, _ in self._local.values():
            # attach afresh: a row's client may have ended this process's Ray connection
            backend = get_registry().get("backend", "local").create()
            link = backend.start(holder)
            try:
                backend.stop()
            finally:
                link.close()
        self._local.clear()
        if self._platform is not None:
            stop_server(self._platform)
        self._platform = None

    def __enter__(self) -> MatrixRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one row ---------------------------------------------------------------------------

    def config(self, row: Row) -> Any:
        """The validated client config of ``row`` on this runner's servers."""
        from arctic_platform.rl.config import ArcticRLClientConfig

        if row.backend == "dss-platform":
            port = self._platform_server()
        else:
            port = self._local_server(row.transport)
        data = row_config(row, self.model(row.arch, row.tied), port=port)
        return ArcticRLClientConfig.model_validate(data)

    def _client(self, row: Row, config: Any) -> Any:
        from arctic_platform.rl.client import ArcticRLClient

        if row.backend == "dss-platform":
            os.environ["ARCTIC_RL_PAT"] = PLATFORM_TOKEN
            os.environ.update(FAST_POLL)
        return ArcticRLClient(config, progress=False)

    def run(self, row: Row) -> RowResult:
        """Run the whole loop on ``row``; a failed check is a failed row, never an exception."""
        start = time.monotonic()
        result = RowResult(row=row.id, passed=False, seconds=0.0)
        client = None
        try:
            config = self.config(row)
            client = self._client(row, config)
            result.checks["start_s"] = round(time.monotonic() - start, 1)
            self._loop(row, client, result.checks)
            result.passed = True
        except Exception as exc:  # a row's failure is reported in its result
            result.error = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            if client is not None:
                try:
                    client._destroy_jobs()
                finally:
                    client.close()
            result.seconds = round(time.monotonic() - start, 1)
        return result

    def _loop(self, row: Row, client: Any, checks: dict[str, Any]) -> None:
        bound = FP32_LOGPROB_BOUND if row.dtype == "float32" else BF16_LOGPROB_BOUND
        sampling = {"n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 3}

        gen = client.generate(PROMPTS, sampling)
        _check(gen["weight_version"] == 0, f"first generate at version {gen['weight_version']}")
        vs_sampler, vs_lp = _agreement(client, gen)
        checks["step0_vs_sampler"], checks["step0_vs_log_prob"] = vs_sampler, vs_lp
        _check(vs_sampler <= bound, f"step 0: trainer vs sampler {vs_sampler:.3g} > {bound}")
        _check(vs_lp <= bound, f"step 0: trainer vs log-prob job {vs_lp:.3g} > {bound}")

        rows, masks, _ = _rows_of(gen["outputs"])
        old = client.fwd_no_grad({"input_ids": rows})
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(rows))]
        grpo = {"input_ids": rows, "loss_mask": masks, "advantages": advantages}
        client.fwd_bwd({**grpo, "old_log_probs": old}, loss_fn="grpo")
        stepped = client.step()
        _check(stepped["applied"] is True and stepped["global_step"] == 1, f"step: {stepped}")

        synced = client.sync_weights()
        _check(synced["weight_version"] == 1, f"sync: {synced}")
        norms = client.weight_norm()
        checks["norms"] = norms
        for job in ("sampling", "log_prob"):
            rel = abs(norms[job] - norms["training"]) / norms["training"]
            _check(rel <= 1e-5, f"weight_norm {job} {norms[job]} vs training {norms['training']}")

        after = client.generate(PROMPTS, {**sampling, "seed": 4})
        _check(after["weight_version"] == 1, f"generate after sync at {after['weight_version']}")
        vs_sampler, vs_lp = _agreement(client, after)
        checks["synced_vs_sampler"], checks["synced_vs_log_prob"] = vs_sampler, vs_lp
        _check(vs_sampler <= bound, f"after sync: trainer vs sampler {vs_sampler:.3g} > {bound}")
        _check(vs_lp <= bound, f"after sync: trainer vs log-prob job {vs_lp:.3g} > {bound}")

        # The loss curve across save, a reconnecting process, and a load.
        sft = {"input_ids": rows, "loss_mask": masks}
        before = client.fwd_bwd(sft, loss_fn="cross_entropy")["loss"]
        _check(client.step()["global_step"] == 2, "second step")
        client.save_checkpoint()
        other = self._reconnect(row, client, sft)
        checks["loss_before_save"], checks["loss_reconnected"] = before, other["loss"]
        _check(other["idle"] == [False, 2], f"reconnected idle step: {other['idle']}")
        _check(other["applied"] is True and other["step"] == 3, f"reconnected step: {other}")
        _check(other["loss"] < before, f"loss {before} -> {other['loss']} after a step")
        _check(client.load_checkpoint(step=2) == 2, "load_checkpoint(step=2)")
        resumed = client.fwd_bwd(sft, loss_fn="cross_entropy")["loss"]
        checks["loss_resumed"] = resumed
        tol = 1e-4 if row.dtype == "float32" else 2e-2
        _check(
            abs(resumed - other["loss"]) <= tol * max(1.0, abs(other["loss"])),
            f"loss after load {resumed} != reconnected process's {other['loss']} at step 2",
        )
        final = client.step()
        _check(final["applied"] is True and final["global_step"] == 3, f"resumed step: {final}")

    def _reconnect(self, row: Row, client: Any, batch: dict[str, Any]) -> dict[str, Any]:
        """Attach from a second process: an idle step, then fwd_bwd and step; its answers."""
        where = self.work_dir / "reconnect" / row.id
        where.mkdir(parents=True, exist_ok=True)
        config_file = where / "config.json"
        batch_file = where / "batch.json"
        config_file.write_text(client.reconnect_config().model_dump_json())
        batch_file.write_text(json.dumps(batch))
        done = subprocess.run(
            [sys.executable, "-c", _RECONNECT, str(config_file), str(batch_file)],
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ),
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        _check(done.returncode == 0 and bool(lines), f"reconnect failed: {done.stderr[-2000:]}")
        return dict(json.loads(lines[-1][len("RESULT ") :]))


def _run_row_here(state_file: str, row_id: str) -> int:
    """A row's own process: run it on the prepared servers and print its ``RowResult``."""
    from dataclasses import asdict

    from bench.matrix_plan import pairwise_rows

    row = next(r for r in pairwise_rows().rows if r.id == row_id)
    result = MatrixRunner.from_state(Path(state_file)).run(row)
    print("RESULT " + json.dumps(asdict(result), default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_run_row_here(*sys.argv[1:3]))
