"""Reading a run back from each tracker's own files, with each library's own reader where it
has one: TensorBoard's event accumulator, MLflow's client, and (wandb 0.31 ships no reader of
offline runs) wandb's record protobuf over the file's LevelDB-log framing."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

Series = dict[str, list[tuple[int, float]]]


def read_tensorboard(log_dir: Path) -> Series:
    """Every scalar tag of the event files in ``log_dir``: ``{tag: [(step, value), ...]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_mlflow(uri: str, experiment: str) -> tuple[Series, dict[str, str]]:
    """The one run of ``experiment`` at ``uri``: its metric histories and its parameters."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} at {uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, f"{len(runs)} runs in {experiment!r}"
    run = runs[0]
    assert run.info.status == "FINISHED", run.info.status
    series = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }
    return series, dict(run.data.params)


_HEADER = b":W&B" + struct.pack("<H", 0xBEE1) + b"\x00"
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_payloads(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.startswith(_HEADER), f"{path} is not a wandb run file"
    payloads: list[bytes] = []
    pending = b""
    offset = len(_HEADER)
    while offset + 7 <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < 7:  # a block's tail too short for a chunk header is padding
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            break
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            payloads.append(pending + chunk)
            pending = b""
    return payloads


def read_wandb(run_file: Path) -> tuple[Series, dict[str, object]]:
    """An offline run's history (``{key: [(step, value)]}``) and its config, from its
    ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    series: Series = {}
    config: dict[str, object] = {}
    for payload in _wandb_payloads(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = record.history.item
            row = {item.key or "/".join(item.nested_key): item.value_json for item in items}
            step = int(json.loads(row.pop("_step")))
            for key, value in row.items():
                if not key.startswith("_"):
                    series.setdefault(key, []).append((step, float(json.loads(value))))
        elif kind == "run":
            for item in record.run.config.update:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    config[key] = json.loads(item.value_json)
    return series, config


def wandb_run_file(log_dir: Path) -> Path:
    """The one offline run file under ``log_dir/wandb``."""
    files = sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"wandb run files: {files}"
    return files[0]
