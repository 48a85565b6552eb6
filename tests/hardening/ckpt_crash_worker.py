"""A DeepSpeed training engine that trains and saves until it is killed (test_checkpoint_crash).

Usage: ``python ckpt_crash_worker.py MODEL ROOT SAVES``. If ROOT holds a complete checkpoint
the engine loads the newest one first. Then, ``SAVES`` times: one optimizer step, then
``save_checkpoint(ROOT)``. One JSON line per event on stdout: ``loaded`` (step, norm),
``saving`` (step, norm, just before the save), ``saved`` (step, path, seconds). After
``loaded`` (or ``fresh``) it waits for a line on stdin before it trains, so the test can
look at the root while nothing writes to it.
"""

from __future__ import annotations

import json
import sys
import time


def _say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(model: str, root: str, saves: int) -> None:
    from arctic_platform.rl.config import ArcticRLClientConfig
    from arctic_platform.rl.interfaces import EngineContext
    from arctic_platform.rl.plugins import get_registry
    from arctic_rl_engines import ds_checkpoint

    config = ArcticRLClientConfig(
        model_name=model,
        training_gpus=1,
        host="127.0.0.1",
        port=7000,
        training_config={"optimizer": {"lr": 1e-3}},
    )
    engine = (
        get_registry()
        .get("engine", "deepspeed", role="training")
        .create(config, EngineContext(role="training"))
    )
    if ds_checkpoint.is_checkpoint(root):
        step = engine.load_checkpoint(root)
        _say("loaded", step=step, norm=engine.weight_norm())
    else:
        _say("fresh", step=engine.global_step, norm=engine.weight_norm())
    sys.stdin.readline()  # the test's go-ahead
    batch = {"input_ids": [[1, 5, 6, 7, 8, 9, 10, 11]] * 4, "advantages": [1.0, -1.0, 0.5, -0.5]}
    for _ in range(saves):
        engine.fwd_bwd(batch, "importance_sampling")
        step = engine.step()["global_step"]
        _say("saving", step=step, norm=engine.weight_norm())
        started = time.monotonic()
        path = engine.save_checkpoint(root)
        _say("saved", step=step, path=path, seconds=time.monotonic() - started)
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
