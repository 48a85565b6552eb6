"""``Batch``: a training batch typed once where a request enters, trusted by everything after.

A batch is built from ragged lists of rows or from dense ``[batch, seq]`` arrays (numpy or
torch) with an ``attention_mask`` (right- or left-padded), and stored packed: each field is
one flat numpy array over the tokens of all rows, cut by ``lengths``. Its structure is checked
when it is built; ``check(limits)`` checks it once against a running job's ``BatchLimits``.
It pickles as a few arrays, so one ``ray.put`` serves every rank of a job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from numbers import Real
from typing import Any

import numpy as np

from arctic_platform.rl.errors import BatchError

BATCH_FIELDS = (
    "input_ids",
    "loss_mask",
    "weights",
    "advantages",
    "old_log_probs",
    "ref_log_probs",
    "rollout_log_probs",
    "target_tokens",
)
"""The fields a batch may hold (``attention_mask`` is also read, for dense ``input_ids``)."""
PER_TOKEN_FIELDS = ("loss_mask", "old_log_probs", "ref_log_probs", "rollout_log_probs")
"""Float fields with one value per token of ``input_ids``. ``weights`` is another name for
``loss_mask`` (per-token loss weights); ``target_tokens[i]`` (for i >= 1), when given, is the
token whose log-prob entry ``i`` scores instead of ``input_ids[i]``: ``log p(target_i | x_<i)``."""
TOKEN_FIELDS = ("input_ids", "target_tokens")
"""Integer fields: token ids, one per position."""
FLOAT_FIELDS = ("loss_mask", "advantages", "old_log_probs", "ref_log_probs", "rollout_log_probs")
"""Float fields as stored (``advantages`` always per token, expanded from per sequence)."""
_ACCEPTED = (*BATCH_FIELDS, "attention_mask")


@dataclass(frozen=True)
class BatchLimits:
    """What a running job accepts: token ids in ``[0, vocab_size)``, rows of at most
    ``max_length`` tokens (None: no limit). Engines report them; the server checks them."""

    vocab_size: int | None = None
    max_length: int | None = None


def _numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (duck-typed: torch is not imported); else ``value``."""
    if hasattr(value, "detach") and hasattr(value, "cpu") and hasattr(value, "numpy"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, Real | np.number) and not isinstance(value, bool | np.bool_)


class _Shape:
    """Row lengths and, for a dense batch, which positions of ``[batch, seq]`` are real."""

    def __init__(self, lengths: np.ndarray, keep: np.ndarray | None = None) -> None:
        self.lengths = lengths
        self.keep = keep  # bool [batch, seq] of a dense batch; None for ragged rows
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def row_of(self, flat_index: int) -> int:
        """The row holding token ``flat_index`` of the packed layout."""
        return int(np.searchsorted(self.offsets, flat_index, side="right") - 1)


class Batch:
    """A checked training batch: ``input_ids``, ``loss_mask`` and the optional float and token
    fields, packed per field into one flat array; rows are ``lengths`` long.

    Build one with ``Batch.build``; engines read it with ``rows``, ``padded`` and ``flat``.
    """

    def __init__(
        self,
        fields: Mapping[str, np.ndarray],
        lengths: np.ndarray,
        *,
        checked: BatchLimits | None = None,
    ) -> None:
        self._fields = dict(fields)
        self.lengths = lengths
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self._checked = checked

    # --- building -----------------------------------------------------------------------

    @classmethod
    def build(cls, data: Any, *, limits: BatchLimits | None = None) -> Batch:
        """A ``Batch`` from a dict of fields (lists of rows, or dense arrays with an
        ``attention_mask``), checked against ``limits``; a ``Batch`` is only checked.

        Raises BatchError naming the field (and row) for: an unknown or missing field, an
        empty batch or row, shapes that disagree, non-integer or out-of-range token ids, rows
        longer than ``limits.max_length``, NaN or infinite values, a mask that selects nothing.
        """
        if isinstance(data, Batch):
            return data.check(limits)
        if not isinstance(data, Mapping):
            raise BatchError(f"a batch is a dict of fields, got {type(data).__name__}")
        unknown = sorted(str(k) for k in set(data) - set(_ACCEPTED))
        if unknown:
            raise BatchError(f"unknown batch field(s) {unknown}; known: {list(_ACCEPTED)}")
        given = {k: _numpy(v) for k, v in data.items() if v is not None}
        if "weights" in given:
            if "loss_mask" in given:
                raise BatchError(
                    "give per-token 'weights' or 'loss_mask', not both (they are one field)"
                )
            given["loss_mask"] = given.pop("weights")
        if "input_ids" not in given:
            raise BatchError("batch has no 'input_ids'")
        shape, ids = _token_ids(given["input_ids"], given.pop("attention_mask", None))
        if limits is not None:  # the tokens' own limits before how other fields fit them
            _check_ids("input_ids", ids, shape, limits.vocab_size)
            _check_length(shape.lengths, limits.max_length)
        fields: dict[str, np.ndarray] = {"input_ids": ids}
        if "target_tokens" in given:
            targets = _per_token("target_tokens", given["target_tokens"], shape, integer=True)
            _check_ids("target_tokens", targets, shape, None)
            fields["target_tokens"] = targets
        for name in PER_TOKEN_FIELDS:
            if name in given:
                fields[name] = _per_token(name, given[name], shape, integer=False)
        if "loss_mask" not in fields:
            mask = np.ones(int(shape.offsets[-1]), dtype=np.float32)
            mask[shape.offsets[:-1]] = 0.0  # the first token has no prediction to train
            fields["loss_mask"] = mask
        if "advantages" in given:
            fields["advantages"] = _advantages(given["advantages"], shape)
        if not np.any(fields["loss_mask"] != 0):
            raise BatchError("loss_mask selects no token in the whole batch")
        return cls(fields, shape.lengths).check(limits)

    def check(self, limits: BatchLimits | None) -> Batch:
        """Check token ids and row lengths against ``limits`` (once per limits); returns self."""
        if limits is None or limits == self._checked:
            return self
        shape = _Shape(self.lengths)
        for name in TOKEN_FIELDS:
            if name in self._fields:
                _check_ids(name, self._fields[name], shape, limits.vocab_size)
        _check_length(self.lengths, limits.max_length)
        self._checked = limits
        return self

    # --- reading ------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Sequences in the batch."""
        return len(self.lengths)

    def __len__(self) -> int:
        return self.num_rows

    @property
    def num_tokens(self) -> int:
        """Tokens over all rows (no padding)."""
        return int(self.offsets[-1])

    @property
    def names(self) -> tuple[str, ...]:
        """The fields this batch holds."""
        return tuple(self._fields)

    @property
    def checked(self) -> BatchLimits | None:
        """The limits this batch was last checked against."""
        return self._checked

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def flat(self, name: str) -> np.ndarray:
        """Field ``name`` over all rows, packed: ``[num_tokens]``."""
        return self._fields[name]

    def row(self, name: str, index: int) -> np.ndarray:
        """Row ``index`` of field ``name`` (a view)."""
        return self._fields[name][self.offsets[index] : self.offsets[index + 1]]

    def rows(self, name: str) -> list[np.ndarray]:
        """Every row of field ``name`` (views)."""
        flat = self._fields[name]
        return [flat[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]

    def padded(
        self, name: str, rows: Sequence[int], width: int, value: float | int = 0
    ) -> np.ndarray:
        """Rows ``rows`` of field ``name`` right-padded with ``value``: ``[len(rows), width]``."""
        flat = self._fields[name]
        index = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[index]
        positions = np.arange(width)
        real = positions[None, :] < lengths[:, None]
        out = np.full((len(index), width), value, dtype=flat.dtype)
        out[real] = flat[(self.offsets[index][:, None] + positions[None, :])[real]]
        return out

    def select(self, rows: Iterable[int]) -> Batch:
        """The sub-batch of ``rows`` (in that order), still checked against the same limits."""
        index = np.asarray(list(rows), dtype=np.int64)
        if index.size == 0:
            return Batch({k: v[:0] for k, v in self._fields.items()}, self.lengths[:0])
        take = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in index])
        fields = {k: v[take] for k, v in self._fields.items()}
        return Batch(fields, self.lengths[index], checked=self._checked)

    def to_lists(self) -> dict[str, list[list[Any]]]:
        """Every field as a list of rows of Python numbers (per-token ``advantages``)."""
        return {name: [r.tolist() for r in self.rows(name)] for name in self._fields}

    def to_padded(self) -> dict[str, np.ndarray]:
        """Every field right-padded to ``[num_rows, longest]`` plus ``attention_mask``;
        ``Batch.build`` of it gives this batch back."""
        width = int(self.lengths.max()) if self.num_rows else 0
        rows = range(self.num_rows)
        out = {name: self.padded(name, rows, width) for name in self._fields}
        out["attention_mask"] = (np.arange(width)[None, :] < self.lengths[:, None]).astype(np.int64)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the packed arrays."""
        return sum(int(v.nbytes) for v in self._fields.values()) + int(self.lengths.nbytes)

    def __repr__(self) -> str:
        return f"Batch(rows={self.num_rows}, tokens={self.num_tokens}, fields={list(self.names)})"


# --- building blocks ------------------------------------------------------------------------


def _rectangular(value: Any) -> Any:
    """Equal-length rows given as lists (a tokenizer's padded output) as one 2-D array;
    anything else as it is."""
    if isinstance(value, np.ndarray) or not isinstance(value, list | tuple) or not value:
        return value
    rows = [_numpy(r) for r in value]
    if not all(
        isinstance(r, list | tuple) or (isinstance(r, np.ndarray) and r.ndim == 1) for r in rows
    ):
        return value
    if len({len(r) for r in rows}) != 1:
        return value
    try:
        array = np.asarray(rows)
    except (TypeError, ValueError):
        return value
    return array if array.ndim == 2 and array.dtype != object else value


def _token_ids(ids: Any, attention_mask: Any) -> tuple[_Shape, np.ndarray]:
    """The shape of the batch and its packed ``input_ids``."""
    if attention_mask is not None:  # padded rows, perhaps as lists
        ids, attention_mask = _rectangular(ids), _rectangular(_numpy(attention_mask))
    if isinstance(ids, np.ndarray) and ids.ndim == 2:
        if not np.issubdtype(ids.dtype, np.integer):
            raise BatchError(f"a dense input_ids must hold integers, got {ids.dtype}")
        if ids.shape[0] == 0:
            raise BatchError("batch is empty: 'input_ids' has no rows")
        shape = _dense_shape(ids, _numpy(attention_mask))
        flat = ids[shape.keep] if shape.keep is not None else ids.reshape(-1)
        flat = flat.astype(np.int64, copy=False)
        _check_ids("input_ids", flat, shape, None)
        return shape, flat
    if attention_mask is not None:
        raise BatchError(
            "attention_mask is only accepted with a dense [batch, seq] input_ids array"
        )
    if isinstance(ids, np.ndarray):
        raise BatchError(
            f"a dense input_ids must be [batch, seq], got shape {list(ids.shape)}; "
            "or give a list of rows"
        )
    rows = _rows("input_ids", ids)
    if not rows:
        raise BatchError("batch is empty: 'input_ids' has no rows")
    for i, row in enumerate(rows):
        if len(row) == 0:
            raise BatchError(f"input_ids[{i}] must be a non-empty list of token ids")
    shape = _Shape(np.array([len(r) for r in rows], dtype=np.int64))
    flat = _flatten("input_ids", rows, shape, integer=True)
    _check_ids("input_ids", flat, shape, None)
    return shape, flat


def _dense_shape(ids: np.ndarray, mask: Any) -> _Shape:
    """Row lengths of a dense ``input_ids`` from its ``attention_mask`` (None: no padding)."""
    batch, seq = ids.shape
    if mask is None:
        if seq == 0:
            raise BatchError("input_ids[0] must be a non-empty list of token ids (seq is 0)")
        return _Shape(np.full(batch, seq, dtype=np.int64))
    if not isinstance(mask, np.ndarray) or mask.shape != ids.shape:
        got = list(mask.shape) if isinstance(mask, np.ndarray) else type(mask).__name__
        raise BatchError(
            f"attention_mask must be an array of input_ids' shape {list(ids.shape)}, got {got}"
        )
    if mask.dtype != np.bool_ and not np.isin(mask, (0, 1)).all():
        raise BatchError("attention_mask must hold only 0 and 1")
    keep = mask != 0
    lengths = keep.sum(axis=1).astype(np.int64)
    positions = np.arange(seq)[None, :]
    right = (positions < lengths[:, None]) == keep
    left = (positions >= seq - lengths[:, None]) == keep
    bad = ~(right.all(axis=1) | left.all(axis=1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise BatchError(
            f"attention_mask[{i}] is neither right- nor left-padded: its ones must be one run "
            "at the start or at the end of the row"
        )
    if (lengths == 0).any():
        i = int(np.flatnonzero(lengths == 0)[0])
        raise BatchError(
            f"input_ids[{i}] must be a non-empty list of token ids (attention_mask[{i}] is "
            "all zeros)"
        )
    return _Shape(lengths, keep)


def _rows(name: str, value: Any) -> list[Any]:
    """``value`` as a list of rows (each a list, tuple or 1-D array)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 2:
            raise BatchError(
                f"batch field {name!r} must be a list of rows or a [batch, seq] array, got an "
                f"array of shape {list(value.shape)}"
            )
        return list(value)
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise BatchError(f"batch field {name!r} must be a list of rows, got {type(value).__name__}")
    rows = [_numpy(r) for r in value]
    for i, row in enumerate(rows):
        if isinstance(row, np.ndarray):
            if row.ndim != 1:
                raise BatchError(f"{name}[{i}] must be one row of numbers, got shape {row.shape}")
        elif not isinstance(row, list | tuple):
            what = "token ids" if name in TOKEN_FIELDS else "numbers"
            raise BatchError(f"{name}[{i}] must be a list of {what}, got {type(row).__name__}")
    return rows


def _flatten(name: str, rows: list[Any], shape: _Shape, *, integer: bool) -> np.ndarray:
    """The rows packed into one int64 (token ids) or float32 array; rows already match
    ``shape``'s lengths."""
    if any(isinstance(r, np.ndarray) for r in rows):
        try:
            parts = [r if isinstance(r, np.ndarray) else np.asarray(r) for r in rows]
        except (TypeError, ValueError, OverflowError):  # nested or unequal inner rows
            return _slow_flatten(name, rows, shape, integer=integer)
        if any(p.dtype == object or p.ndim != 1 for p in parts):
            return _slow_flatten(name, rows, shape, integer=integer)
        kinds = {p.dtype.kind for p in parts if p.size}
        flat = np.concatenate(parts) if parts else np.zeros(0)
        if integer and kinds - {"i", "u"}:
            return _slow_flatten(name, [list(p) for p in parts], shape, integer=True)
    else:
        values = list(chain.from_iterable(rows))
        if integer and any(v.__class__ is bool for v in values):
            return _slow_flatten(name, rows, shape, integer=True)
        try:
            flat = np.asarray(values) if integer else np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            return _slow_flatten(name, rows, shape, integer=integer)
        if integer and flat.size and flat.dtype.kind not in "iu":
            return _slow_flatten(name, rows, shape, integer=True)
    if integer:
        if flat.dtype.kind == "u" and flat.size and int(flat.max()) > np.iinfo(np.int64).max:
            return _slow_flatten(name, [list(map(int, r)) for r in rows], shape, integer=True)
        return flat.astype(np.int64, copy=False)
    if flat.dtype.kind not in "iufb":
        return _slow_flatten(name, rows, shape, integer=False)
    return _finite(name, _float32(flat), shape)


def _slow_flatten(name: str, rows: list[Any], shape: _Shape, *, integer: bool) -> np.ndarray:
    """Find the first value that is not a token id (or a number) and name it."""
    for i, row in enumerate(rows):
        for value in row:
            value = value.item() if isinstance(value, np.generic) else value
            if integer:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise BatchError(f"{name}[{i}] holds a non-integer token {value!r}")
                if not 0 <= value < 2**63:
                    raise BatchError(
                        f"{name}[{i}] holds token id {value} outside the vocabulary [0, inf)"
                    )
            elif not isinstance(value, Real):
                raise BatchError(f"{name}[{i}] holds {value!r}, not a number")
    raise BatchError(f"batch field {name!r} holds values of mixed or unknown types")


def _float32(values: np.ndarray) -> np.ndarray:
    """``values`` as float32; a value past float32's range becomes inf (and is refused)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float32)


def _finite(name: str, flat: np.ndarray, shape: _Shape) -> np.ndarray:
    bad = ~np.isfinite(flat)
    if bad.any():
        i = shape.row_of(int(np.flatnonzero(bad)[0]))
        raise BatchError(f"{name}[{i}] holds a NaN or infinite value (as a 32-bit float)")
    return flat


def _check_ids(name: str, flat: np.ndarray, shape: _Shape, vocab_size: int | None) -> None:
    """Every id of ``flat`` in ``[0, vocab_size)`` (``[0, inf)`` without a vocabulary)."""
    if not flat.size:
        return
    bad = flat < 0
    if vocab_size is not None:
        bad |= flat >= vocab_size
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise BatchError(
            f"{name}[{shape.row_of(at)}] holds token id {int(flat[at])} outside the vocabulary "
            f"[0, {vocab_size if vocab_size is not None else 'inf'})"
        )


def _check_length(lengths: np.ndarray, max_length: int | None) -> None:
    """Every row at most ``max_length`` tokens long."""
    if max_length is None or not lengths.size or int(lengths.max()) <= max_length:
        return
    first = int(np.flatnonzero(lengths > max_length)[0])
    raise BatchError(
        f"input_ids[{first}] has {int(lengths[first])} tokens, more than the model's context "
        f"{max_length}"
    )


def _per_token(name: str, value: Any, shape: _Shape, *, integer: bool) -> np.ndarray:
    """A per-token field packed like ``input_ids``: cut by the mask when dense, else rows
    whose lengths must match ``input_ids``'s."""
    if shape.keep is not None:
        value = _rectangular(value)
    if isinstance(value, np.ndarray) and shape.keep is not None:
        if value.shape != shape.keep.shape:
            raise BatchError(
                f"{name!r} is an array of shape {list(value.shape)}; with a dense input_ids "
                f"it must have input_ids' shape {list(shape.keep.shape)}"
            )
        flat = value[shape.keep]
        if integer:
            if flat.dtype.kind not in "iu":
                raise BatchError(f"a dense {name} must hold integers, got {value.dtype}")
            return flat.astype(np.int64, copy=False)
        if flat.dtype.kind not in "iufb":
            raise BatchError(f"a dense {name} must hold numbers, got {value.dtype}")
        return _finite(name, _float32(flat), shape)
    rows = _rows(name, value)
    if len(rows) != shape.rows:
        raise BatchError(f"{name!r} has {len(rows)} rows, input_ids has {shape.rows}")
    for i, row in enumerate(rows):
        if len(row) != shape.lengths[i]:
            raise BatchError(
                f"{name}[{i}] has {len(row)} entries, input_ids[{i}] has {int(shape.lengths[i])}"
            )
    return _flatten(name, rows, shape, integer=integer)


def _advantages(value: Any, shape: _Shape) -> np.ndarray:
    """``advantages`` per token: given per sequence (``[batch]``) or per token."""
    if shape.keep is not None:
        value = _rectangular(value)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        if len(value) != shape.rows:
            raise BatchError(f"'advantages' has {len(value)} rows, input_ids has {shape.rows}")
        if value.dtype.kind not in "iuf":
            raise BatchError(f"'advantages' must hold numbers, got {value.dtype}")
        per_row = _finite("advantages", _float32(value), _Shape(np.ones(shape.rows, int)))
        return np.repeat(per_row, shape.lengths)
    if isinstance(value, np.ndarray):
        return _per_token("advantages", value, shape, integer=False)
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise BatchError(f"batch field 'advantages' must be a list, got {type(value).__name__}")
    if len(value) != shape.rows:
        raise BatchError(f"'advantages' has {len(value)} rows, input_ids has {shape.rows}")
    items = [_numpy(a) for a in value]
    if all(_is_number(a) for a in items):
        ones = _Shape(np.ones(shape.rows, dtype=np.int64))
        per_row = _finite("advantages", _float32(np.asarray(items, dtype=np.float64)), ones)
        return np.repeat(per_row, shape.lengths)
    rows: list[Any] = []
    for i, a in enumerate(items):
        if _is_number(a):
            rows.append([float(a)] * int(shape.lengths[i]))
        elif isinstance(a, list | tuple) or (isinstance(a, np.ndarray) and a.ndim == 1):
            if len(a) != shape.lengths[i]:
                raise BatchError(
                    f"advantages[{i}] has {len(a)} entries, input_ids[{i}] has "
                    f"{int(shape.lengths[i])} (give one advantage per sequence or one per token)"
                )
            rows.append(a)
        else:
            raise BatchError(f"advantages[{i}] must be a number or a list, got {a!r}")
    return _flatten("advantages", rows, shape, integer=False)


__all__ = [
    "BATCH_FIELDS",
    "PER_TOKEN_FIELDS",
    "Batch",
    "BatchError",
    "BatchLimits",
]
