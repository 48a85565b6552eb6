"""Tinker's protobuf bodies to our batches and back (the SDK's generated ``tinker_public_pb2``).

A Tinker datum scores ``target_tokens[i]`` after ``model_input[: i + 1]``. Our rows score
entry ``i`` after ``input_ids[:i]`` with entry 0 unused, so a datum of ``N`` input tokens
becomes a row of ``N + 1`` tokens (its last input is never context), ``target_tokens``
shifted right by one, and every per-token input with a 0 in front.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arctic_platform.rl.api import MISMATCH_METRICS, InvalidRequestError

KNOWN_INPUTS = ("target_tokens", "weights", "logprobs", "advantages")
"""``loss_fn_inputs`` this front-end maps; any other key is refused (400)."""


class TinkerInputError(InvalidRequestError):
    """A Tinker request body that cannot be mapped onto our operations."""

    remedy = "Use only the loss functions and inputs this server maps (the message lists them)."
    # the request's model and seq_id once its header was read: its place must be released
    model_id: str | None = None
    seq_id: int | None = None


def _pb() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def _tensor(msg: Any, what: str) -> np.ndarray:
    """A dense 1-D array from a proto ``Tensor`` (float32 or int64)."""
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.dtype not in dtypes:
        raise TinkerInputError(f"{what}: tensor dtype {msg.dtype} is not float32 or int64")
    dtype = np.dtype(dtypes[msg.dtype])
    if msg.WhichOneof("encoding") == "sparse_csr":
        raise TinkerInputError(f"{what}: sparse tensors are not supported by this server")
    data = msg.dense
    if len(data) % dtype.itemsize:
        raise TinkerInputError(f"{what}: {len(data)} bytes is not a whole number of {dtype}")
    array = np.frombuffer(data, dtype=dtype)
    shape = list(msg.shape)
    if shape and (len(shape) != 1 or shape[0] != array.size):
        raise TinkerInputError(f"{what}: shape {shape} is not the 1-D shape of {array.size} values")
    return array


@dataclass
class Batch:
    """One forward_backward request as our fwd_bwd batch, and what the answer needs."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_config: dict[str, float]
    forward_only: bool
    batch: dict[str, Any] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)  # each datum's target count


def parse_forward_backward(body: bytes) -> Batch:
    """Decode a ``ForwardBackwardRequest`` body into a ``Batch`` (raises TinkerInputError)."""
    from google.protobuf.message import DecodeError

    request = _pb().ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise TinkerInputError(f"the body is not a ForwardBackwardRequest: {exc}") from None
    if not request.model_id:
        raise TinkerInputError("ForwardBackwardRequest has no model_id")
    try:
        return _forward_backward_batch(request)
    except TinkerInputError as exc:  # refused after the header: its seq_id must be freed
        exc.model_id, exc.seq_id = request.model_id, int(request.seq_id)
        raise


def _forward_backward_batch(request: Any) -> Batch:
    """The ``Batch`` of a decoded ``ForwardBackwardRequest`` (raises TinkerInputError)."""
    config: dict[str, float] = {}
    for key, value in request.loss_fn_config.items():
        config[key] = float(value)
    for key, value in request.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "text":
            raise TinkerInputError(f"loss_fn_config {key}={value.text!r}: text values are refused")
        config[key] = float(value.number)
    out = Batch(
        model_id=request.model_id,
        seq_id=int(request.seq_id),
        loss_fn=request.loss_fn,
        loss_config=config,
        forward_only=bool(request.forward_only),
    )
    if not request.data:
        raise TinkerInputError("ForwardBackwardRequest has no data")
    rows: dict[str, list[Any]] = {"input_ids": [], "target_tokens": []}
    floats = {"weights": "loss_mask", "logprobs": "old_log_probs", "advantages": "advantages"}
    present = None
    for i, datum in enumerate(request.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise TinkerInputError(f"data[{i}]: only encoded_text chunks are supported")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise TinkerInputError(f"data[{i}]: token bytes are not whole int32 values")
            tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
        inputs = dict(datum.loss_fn_inputs)
        unknown = sorted(set(inputs) - set(KNOWN_INPUTS))
        if unknown:
            raise TinkerInputError(
                f"data[{i}]: loss_fn_inputs {unknown} are not supported; known: "
                f"{list(KNOWN_INPUTS)}"
            )
        if "target_tokens" not in inputs:
            raise TinkerInputError(f"data[{i}]: loss_fn_inputs has no target_tokens")
        keys = frozenset(inputs)
        if present is None:
            present = keys
        elif keys != present:
            raise TinkerInputError(
                f"data[{i}] has loss_fn_inputs {sorted(keys)}, data[0] has {sorted(present)}"
            )
        targets = _tensor(inputs["target_tokens"], f"data[{i}].target_tokens")
        if not tokens:
            raise TinkerInputError(f"data[{i}]: model_input is empty")
        if targets.size != len(tokens):
            raise TinkerInputError(
                f"data[{i}]: target_tokens has {targets.size} entries, model_input has "
                f"{len(tokens)} tokens (they must be equal)"
            )
        rows["input_ids"].append([*tokens, int(targets[-1])])
        rows["target_tokens"].append([0, *(int(t) for t in targets)])
        for name, ours in floats.items():
            if name not in inputs:
                continue
            values = _tensor(inputs[name], f"data[{i}].{name}")
            if values.size != len(tokens):
                raise TinkerInputError(
                    f"data[{i}]: {name} has {values.size} entries, model_input has "
                    f"{len(tokens)} tokens (they must be equal)"
                )
            rows.setdefault(ours, []).append([0.0, *(float(v) for v in values)])
        out.lengths.append(len(tokens))
    if "loss_mask" not in rows:  # no weights: every target token counts
        rows["loss_mask"] = [[0.0] + [1.0] * n for n in out.lengths]
    out.batch = rows
    return out


TINKER_METRIC_NAMES = {
    "mismatch_k1": "kl_sample_train_v1:mean",
    "mismatch_k2": "kl_sample_train_v2:mean",
}
"""Our mismatch metrics under the names Tinker's cookbook gives them (the others keep ours,
with the ``:mean`` reduction)."""


def forward_backward_output(batch: Batch, result: dict[str, Any]) -> bytes:
    """Our fwd_bwd answer as a ``ForwardBackwardOutput`` protobuf (logprobs per datum, the
    summed loss and, for losses given the sampler's log-probs, the mismatch means and the
    ratio's min and max)."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    msg.metrics["loss:sum"] = float(result.get("loss.sum", 0.0))
    for name in MISMATCH_METRICS:
        if name in result:
            msg.metrics[TINKER_METRIC_NAMES.get(name, f"{name}:mean")] = float(result[name])
    for reduction in ("min", "max"):
        if f"mismatch_ratio.{reduction}" in result:
            msg.metrics[f"mismatch_ratio:{reduction}"] = float(
                result[f"mismatch_ratio.{reduction}"]
            )
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(batch.lengths)
    rows = [
        np.asarray(row[1 : n + 1], dtype=np.float32)
        for row, n in zip(result["log_probs"], batch.lengths, strict=True)
    ]
    offsets = np.cumsum([0] + [r.nbytes for r in rows]).astype(np.int64)
    logprobs = record.fields["logprobs"]
    logprobs.dtype = pb.DTYPE_FLOAT32
    logprobs.data = b"".join(r.tobytes() for r in rows)
    logprobs.offsets = offsets.tobytes()
    return bytes(msg.SerializeToString())


STOP_REASONS = {"length": "STOP_REASON_LENGTH"}


def sample_output(
    completions: list[dict[str, Any]], prompt_logprobs: list[float | None] | None
) -> bytes:
    """Our generate answer (one prompt) as a ``SampleResponse`` protobuf."""
    pb = _pb()
    msg = pb.SampleResponse()
    for completion in completions:
        seq = msg.sequences.add()
        reason = STOP_REASONS.get(str(completion.get("finish_reason")), "STOP_REASON_STOP")
        seq.stop_reason = getattr(pb, reason)
        seq.tokens = np.asarray(completion["token_ids"], dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(completion["logprobs"], dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return bytes(msg.SerializeToString())
