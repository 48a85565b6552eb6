"""Drive jobs that already run on a server, by host/port and job ids (no GPUs requested).

Start a server and jobs elsewhere (e.g. the first example, or ``arctic-rl serve``), save the
client's ``reconnect_config()`` as JSON, then::

    python examples/attach_to_server.py --config reconnect.json

or name the server and the jobs directly::

    python examples/attach_to_server.py --host 127.0.0.1 --port 7000 --model ./my-model \\
        --training-job 3 --sampling-job 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from arctic_platform.rl import ArcticRLClient, ArcticRLClientConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", help="a JSON file written from client.reconnect_config()")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model", dest="model_name")
    parser.add_argument("--training-job", dest="training_job_id", type=int)
    parser.add_argument("--sampling-job", dest="sampling_job_id", type=int)
    parser.add_argument("--log-prob-job", dest="log_prob_job_id", type=int)
    fields = vars(parser.parse_args())  # without --config: the config's fields

    if path := fields.pop("config"):
        config = ArcticRLClientConfig.model_validate_json(Path(path).read_text())
    else:
        config = ArcticRLClientConfig(**fields)
    client = ArcticRLClient(config)  # reconnect mode: verifies the jobs are running
    try:
        print("jobs:", client.job_ids)
        print("weight norms:", client.weight_norm())
        if client.job_ids["sampling"] is not None:
            out = client.generate(["digits summing to 9:"], {"n": 2, "max_tokens": 6})
            print([c["text"] for c in out["outputs"][0]["completions"]])
    finally:
        client.close()  # leaves the jobs running for whoever comes next


if __name__ == "__main__":
    main()
