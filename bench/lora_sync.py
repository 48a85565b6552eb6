"""Adapter sync vs full sync: bytes and seconds of ``sync_weights`` for the same model, same run.

One local server, started here with four logical GPUs (colocated jobs all share one GPU
bundle, which holds three workers, so each job gets a GPU of its own), holds two pairs of
jobs on the same base model: a full fine-tuning pair (training + sampling) and a LoRA pair
(``training_config.lora``); both clients attach to it. Each repetition takes one optimizer
step on both trainers (so every sync moves new weights), then times ``sync_weights`` of each
pair back to back, in alternating order (``bench.timing.paired``).
Reported: the bytes each sync moved (the server's own count), the median seconds, and the
adapter/full ratios (bytes, and the median of the per-repetition time ratios). The full
sync goes through the same coordinator and link, so the ratio is what LoRA saves on the wire
and in the sampler's load.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from bench.servers import loopback_config, start_server, stop_server
from bench.timing import Side, paired

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
    "medium": {"hidden_size": 512, "num_layers": 8, "num_heads": 8},
    # 103 M parameters (8 x 12.85 M in the layers, 1 M in embeddings and head): the issue's
    # "at least 100 M" model
    "100m": {"hidden_size": 1024, "num_layers": 8, "num_heads": 16, "intermediate_size": 2816},
}
ATTENTION_AND_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _batch(tokenizer: Any) -> dict[str, Any]:
    """Four short rows with cross-entropy targets: enough for a step that moves every weight."""
    rows = [tokenizer.encode(text) for text in ("12 + 30 = 42", "7 + 5 = 12", "a b c d", "9 9 9")]
    return {
        "input_ids": rows,
        "loss_mask": [[0.0] + [1.0] * (len(r) - 1) for r in rows],
    }


def run(size: str = "100m", rank: int = 16, repeats: int = 7) -> dict[str, Any]:
    """Median bytes and seconds of an adapter sync (rank ``rank``, attention and MLP) and a
    full sync of the same model, and their ratios."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from arctic_platform.rl.client import ArcticRLClient
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.testing import build_tiny_model, free_port

    root = Path(tempfile.mkdtemp(prefix="arctic-bench-lora-"))
    os.environ["ARCTIC_RL_HOME"] = str(root / "arctic")
    shape = SIZES[size]
    model = str(
        build_tiny_model(
            Path(tempfile.gettempdir()) / "arctic_rl_bench_models" / f"lora-{size}", **shape
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    port = free_port()
    args = ["serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--run-dir", str(root / "run"), "--num-gpus", "4", "--no-ray-auto-attach"]
    server = start_server(
        args, health_url=f"http://127.0.0.1:{port}/health", log=root / "server.log"
    )

    def config(lora: dict[str, Any] | None) -> ArcticRLClientConfig:
        return loopback_config(
            model,
            port,
            training_gpus=1,
            sampling_gpus=1,
            log_prob_gpus=0,
            colocate=False,
            training_config={"optimizer": {"lr": 1e-3}, **({"lora": lora} if lora else {})},
        )

    full = lora = None
    batch = _batch(tokenizer)
    last: dict[str, dict[str, Any]] = {}
    try:
        full = ArcticRLClient(config(None))
        lora = ArcticRLClient(config({"rank": rank, "target_modules": ATTENTION_AND_MLP}))

        def step_both() -> None:
            for client in (full, lora):
                client.fwd_bwd(batch, loss_fn="cross_entropy")
                client.step()

        def side(name: str, client: ArcticRLClient) -> Side:
            def sync() -> dict[str, Any]:
                last[name] = client.sync_weights()
                return last[name]

            return Side(sync, measure=lambda answer: {"bytes": float(answer["bytes"])})

        timing = paired(
            {"adapter": side("adapter", lora), "full": side("full", full)},
            repeats=repeats,
            warmup=1,
            before=step_both,
        )
        info = lora.job_info("training")
    finally:
        for client in (lora, full):
            if client is not None:
                client.close()
        stop_server(server)
    adapter_bytes = timing.median("adapter", "bytes")
    full_bytes = timing.median("full", "bytes")
    return {
        "size": size,
        "shape": shape,
        "parameters": full_bytes / 4,  # fp32
        "targets": ATTENTION_AND_MLP,
        "rank": rank,
        "repeats": repeats,
        "adapter_bytes": adapter_bytes,
        "full_bytes": full_bytes,
        "bytes_ratio": adapter_bytes / full_bytes,
        "adapter_seconds": timing.median("adapter"),
        "full_seconds": timing.median("full"),
        "time_ratio": timing.ratio("adapter", "full"),
        "lora_job": info,
        "timing": timing.model_dump(),
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The markdown rows of ``python -m bench``."""
    model = f"{report['parameters'] / 1e6:.0f} M params"
    return [
        (
            f"adapter sync, LoRA rank {report['rank']} attention+MLP ({model})",
            f"{report['adapter_bytes']:,.0f} B in {report['adapter_seconds'] * 1e3:.1f} ms",
            f"{report['bytes_ratio']:.3f} of the full sync's bytes",
        ),
        (
            f"full sync, same model and run ({model})",
            f"{report['full_bytes']:,.0f} B in {report['full_seconds'] * 1e3:.1f} ms",
            f"adapter/full time {report['time_ratio']:.2f} (median of paired ratios)",
        ),
    ]


if __name__ == "__main__":  # pragma: no cover - a manual run
    import json
    import sys

    result = run(*(sys.argv[1:2] or ["100m"]))
    result.pop("timing")
    print(json.dumps(result, indent=2))
    for row in rows(result):
        print(" | ".join(row))
