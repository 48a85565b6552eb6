"""The server's sync_weights over real engines: the second sync reuses the kept pair worlds
and still delivers the new weights to every replica."""

from __future__ import annotations

import os

import pytest

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tiny_model_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("arctic-home")
    old = os.environ.get("ARCTIC_RL_HOME")
    os.environ["ARCTIC_RL_HOME"] = str(home)
    config = ArcticRLClientConfig(
        model_name=tiny_model_path,
        comm_protocol="http",
        host="127.0.0.1",
        port=free_port(),
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
        ray_auto_attach=False,
        server_logs=False,
        startup_timeout=300,
        job_ready_timeout=600,
        training_config={"optimizer": {"lr": 1e-2}},
    )
    c = ArcticRLClient(config, progress=False)
    yield c
    try:
        c.shutdown()
    finally:
        if old is None:
            os.environ.pop("ARCTIC_RL_HOME", None)
        else:
            os.environ["ARCTIC_RL_HOME"] = old


def _train_step(client: ArcticRLClient) -> None:
    gen = client.generate(["12 + 30 =", "write a number"], {"n": 2, "max_tokens": 6, "seed": 1})
    rows, masks = [], []
    for out in gen["outputs"]:
        prompt = out["prompt_token_ids"]
        for completion in out["completions"]:
            rows.append(prompt + completion["token_ids"])
            masks.append([0] * len(prompt) + [1] * len(completion["token_ids"]))
    old = client.fwd_no_grad({"input_ids": rows})
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(rows))]
    client.fwd_bwd(
        {"input_ids": rows, "loss_mask": masks, "advantages": advantages, "old_log_probs": old},
        loss_fn="grpo",
    )
    client.step()


def test_second_sync_reuses_the_pair_worlds_and_moves_the_new_weights(client):
    first = client.sync_weights()
    assert first["reused_connections"] == 0 and first["strategy"] == "drain"
    norms = client.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)

    _train_step(client)
    changed = client.weight_norm()
    assert changed["training"] != pytest.approx(changed["sampling"], rel=1e-7)
    second = client.sync_weights()
    assert second["weight_version"] == first["weight_version"] + 1
    assert second["reused_connections"] == 2  # the sampling and the log-prob replica
    assert second["bytes"] == first["bytes"] and second["bandwidth_gbps"] > 0
    norms = client.weight_norm()
    assert norms["sampling"] == pytest.approx(norms["training"], rel=1e-5)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-5)
    assert (
        client.generate(["12 + 30 ="], {"n": 1, "max_tokens": 4})["weight_version"]
        == (second["weight_version"])
    )
