"""A training loop run as its own process by the fault tests (and killed by them).

``python fault_loop.py CONFIG_JSON LOG_JSONL STEPS``: attaches to the training job named in
the reconnect config and runs loop steps 1..STEPS-1, each a ``fwd_bwd`` then a ``step`` with
request ids derived from the step. A replacement process reads the log and carries on with
the first step whose ``step`` is not logged, repeating its ``fwd_bwd`` with the same id (the
server answers it without a second gradient when it was applied already).

With ``LOOP_HOLD_AFTER_FWD_BWD=i`` the loop stops after logging ``fwd_bwd`` of step ``i`` and
waits there until it is killed, so a test's kill lands between that ``fwd_bwd`` and its
``step`` however slow the machine is.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from random import Random

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig

LOSS = "cross_entropy"
DETERMINISTIC = {  # the client settings of the fault tests' training jobs
    "startup_timeout": 120,
    "full_determinism": True,
    "seed": 7,
    # eps=1 makes the update grow with the gradient, so a gradient applied twice shows
    "training_config": {"optimizer": {"lr": 1e-2, "eps": 1.0, "gradient_clipping": None}},
}


def batch(i: int) -> dict:
    """The deterministic batch of loop step ``i`` (token ids inside the tiny vocabulary)."""
    rng = Random(i)
    rows = [[rng.randrange(3, 400) for _ in range(12)] for _ in range(4)]
    return {"input_ids": rows, "loss_mask": [[0] * 4 + [1] * 8 for _ in rows]}


def _record(log_file: str, **rec: object) -> None:
    with open(log_file, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(config_file: str, log_file: str, steps: int) -> None:
    done: dict[int, set[str]] = {}
    if os.path.exists(log_file):
        with open(log_file) as f:
            for line in f:
                rec = json.loads(line)
                done.setdefault(rec["i"], set()).add(rec["phase"])
    start = min([i for i in range(1, steps) if "step" not in done.get(i, set())], default=steps)
    with open(config_file) as f:
        config = ArcticRLClientConfig.model_validate_json(f.read())
    client = ArcticRLClient(config, progress=False)
    hold = os.environ.get("LOOP_HOLD_AFTER_FWD_BWD")
    for i in range(start, steps):
        m = client.fwd_bwd(batch(i), LOSS, request_id=f"fb-{i}")
        _record(log_file, i=i, phase="fwd_bwd", loss=m["loss"], replayed=m.get("replayed", False))
        if hold is not None and i == int(hold):
            threading.Event().wait()  # held here until the test kills this process
        s = client.step(request_id=f"st-{i}")
        _record(log_file, i=i, phase="step", global_step=s["global_step"])
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
