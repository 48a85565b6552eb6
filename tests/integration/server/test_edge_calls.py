"""Edge calls a loop makes, through a real ``arctic-rl serve`` (http), Ray and real engines.

One server holds a ZeRO-3 training job of two ranks and a DeepSpeed log-prob job (the sync
target), started with a ``checkpoint_path`` that does not exist yet. The tests run in file
order on those jobs: a step with nothing accumulated (also from a second, reconnected
process: issue 17), an empty batch, two syncs and two saves at one step, a load of the step
the job is at, an engine failure (a 500 with the traceback in the job's log), bad
``checkpoint_path`` values, and last a fresh server that resumes from the same path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.clients import arctic_home, client_config, in_second_process

from arctic_platform.rl.client import ArcticRLClient
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import ServerError
from arctic_platform.rl.testing import free_port

pytestmark = pytest.mark.slow

ROW = [1, 5, 6, 7, 8, 9, 10]
BATCH = {"input_ids": [ROW, ROW[:5]], "advantages": [1.0, -0.5]}


def _config(model: str, checkpoint_path: Path, log_prob_gpus: int = 1) -> ArcticRLClientConfig:
    return client_config(
        model,
        free_port(),
        training_gpus=2,
        sampling_gpus=0,
        log_prob_gpus=log_prob_gpus,
        log_prob_engine="deepspeed",
        ds_config={"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
        checkpoint_path=str(checkpoint_path),
        training_config={"optimizer": {"lr": 1e-2}},
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with arctic_home(tmp_path_factory.mktemp("arctic-home")):
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The run's checkpoint root: two levels that do not exist yet."""
    return tmp_path_factory.mktemp("runs") / "run-1" / "checkpoints"


@pytest.fixture(scope="module")
def client(tiny_model_path, root, home):
    assert not root.parent.exists()
    c = ArcticRLClient(_config(tiny_model_path, root), progress=False)
    yield c
    c.shutdown()


def _norms(client: ArcticRLClient) -> dict[str, float]:
    return client.weight_norm()


def test_a_missing_checkpoint_path_starts_from_model_name(client):
    assert client.job_info("training")["global_step"] == 0
    norms = _norms(client)
    assert norms["training"] == pytest.approx(norms["log_prob"], rel=1e-6)


def test_a_step_with_nothing_accumulated_is_not_applied(client):
    before = _norms(client)["training"]
    answer = client.step()
    assert answer["applied"] is False and answer["global_step"] == 0
    assert _norms(client)["training"] == before


def test_a_normal_step_is_applied(client):
    before = _norms(client)["training"]
    client.fwd_bwd(BATCH, loss_fn="importance_sampling")
    answer = client.step()
    assert answer["applied"] is True and answer["global_step"] == 1
    assert _norms(client)["training"] != before


def test_an_empty_batch_is_a_422_and_accumulates_nothing(client):
    step, before = client.job_info("training")["global_step"], _norms(client)["training"]
    with pytest.raises(ServerError) as info:
        client.fwd_bwd({"input_ids": [], "advantages": []}, loss_fn="importance_sampling")
    assert info.value.status_code == 422 and "empty" in info.value.message
    answer = client.step()
    assert answer["applied"] is False and answer["global_step"] == step
    assert _norms(client)["training"] == before


def test_a_reconnected_process_steps_with_nothing_accumulated(client, root, tmp_path):
    path = client.save_checkpoint()
    assert Path(path).parent == root
    step, before = client.job_info("training")["global_step"], _norms(client)["training"]
    body = f"""
        idle = c.step()
        norm = c.weight_norm()["training"]
        c.fwd_bwd({BATCH!r}, loss_fn="importance_sampling")
        done = c.step()
        result = {{"idle": idle, "norm": norm, "done": done}}
        """
    result = in_second_process(client, body, tmp_path)
    assert result["idle"]["applied"] is False and result["idle"]["global_step"] == step
    assert result["norm"] == before
    assert result["done"]["applied"] is True and result["done"]["global_step"] == step + 1
    assert client.job_info("training")["global_step"] == step + 1


def test_a_second_sync_without_a_step_moves_the_same_weights(client):
    first = client.sync_weights()
    norms = _norms(client)
    assert norms["log_prob"] == pytest.approx(norms["training"], rel=1e-6)
    scored = client.log_probs([ROW[:3]], [ROW[3:]])["outputs"]
    second = client.sync_weights()
    assert second["weight_version"] == first["weight_version"] + 1  # every sync is a version
    assert second["bytes"] == first["bytes"]
    assert _norms(client) == norms
    assert client.log_probs([ROW[:3]], [ROW[3:]])["outputs"] == scored


def test_saving_twice_at_one_step_rewrites_one_checkpoint(client, root):
    step = client.job_info("training")["global_step"]
    first = client.save_checkpoint()
    second = client.save_checkpoint()
    assert first == second == str(root / f"global_step{step}")
    info = client.job_info("training")
    assert info["global_step"] == step and info["latest_checkpoint"] == first
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []


def test_loading_the_step_it_is_at_discards_pending_gradients(client):
    step, before = client.job_info("training")["global_step"], _norms(client)["training"]
    client.fwd_bwd(BATCH, loss_fn="importance_sampling")
    assert client.load_checkpoint() == step  # the latest: saved at this very step
    assert _norms(client)["training"] == before
    answer = client.step()
    assert answer["applied"] is False and answer["global_step"] == step
    assert _norms(client)["training"] == before


def test_an_engine_failure_is_a_500_naming_job_and_operation(client, root):
    training = client.job_ids["training"]
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "arctic_rl_checkpoint.json").write_text('{"global_step": 0, "world_size": "two"}')
    try:
        with pytest.raises(ServerError) as info:
            client.load_checkpoint(path="corrupt")
    finally:
        (corrupt / "arctic_rl_checkpoint.json").unlink()
        corrupt.rmdir()
    message = info.value.message
    assert info.value.status_code == 500, message
    assert f"load_checkpoint on job {training}" in message and "ValueError" in message
    log = re.search(r"traceback in (\S+job\.log)", message)
    assert log, message
    text = Path(log.group(1)).read_text()
    assert "Traceback" in text and "ValueError" in text and "load_checkpoint" in text
    assert client.job_info("training")["state"] == "running"
    assert client.step()["applied"] is False  # the job keeps serving


def test_a_file_or_unwritable_checkpoint_path_is_a_422_naming_the_field(client, tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    jobs = len(client.get_server_state()["jobs"])
    for path, words in ((a_file, "is a file"), (a_file / "sub", "cannot be written")):
        config = {"model_name": client.config.model_name, "training_gpus": 1}
        config["checkpoint_path"] = str(path)
        with pytest.raises(ServerError) as info:
            client.transport.call("initialize", {"job_type": "training", "config": config})
        assert info.value.status_code == 422
        assert "checkpoint_path" in info.value.message and words in info.value.message
    assert len(client.get_server_state()["jobs"]) == jobs


def test_a_fresh_server_given_the_same_checkpoint_path_resumes_at_the_saved_step(
    client, tiny_model_path, root
):
    client.fwd_bwd(BATCH, loss_fn="importance_sampling")
    client.step()
    client.save_checkpoint()
    saved, norm = client.job_info("training")["global_step"], _norms(client)["training"]
    client.shutdown()
    fresh = ArcticRLClient(_config(tiny_model_path, root, log_prob_gpus=0), progress=False)
    try:
        assert fresh.job_info("training")["global_step"] == saved
        assert _norms(fresh)["training"] == pytest.approx(norm, rel=1e-12)
        fresh.fwd_bwd(BATCH, loss_fn="importance_sampling")
        assert fresh.step()["global_step"] == saved + 1
        assert Path(fresh.save_checkpoint()) == root / f"global_step{saved + 1}"
    finally:
        fresh.shutdown()
