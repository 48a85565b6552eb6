"""The ``structured_outputs`` sampling param: vLLM's constrained decoding, checked as it comes
over the wire (a dict) and turned into ``vllm.sampling_params.StructuredOutputsParams``.

One constraint per request: ``json`` (a JSON schema, dict or string), ``regex``, ``choice``,
``grammar`` (EBNF or Lark), ``json_object`` (true) or ``structural_tag`` (xgrammar's
``{"type": "structural_tag", "format": ...}``, dict or string). Options beside it:
``disable_any_whitespace``, ``disable_additional_properties``, ``whitespace_pattern``.
Shape errors are ``InvalidRequestError`` here; a constraint that vLLM cannot compile is one
when the request is added (``vllm_loop``). Every sampled id keeps its own log-prob: the
constraint only masks the logits before sampling.
"""

from __future__ import annotations

import json
from typing import Any

from arctic_platform.rl.api import InvalidRequestError

KEY = "structured_outputs"
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def _fail(rule: str) -> InvalidRequestError:
    return InvalidRequestError(f"sampling_params[{KEY!r}] {rule}")


def _json_text(name: str, value: Any) -> str:
    """``value`` (a dict or its JSON text) as JSON text; must be an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _fail(f"[{name!r}] is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _fail(f"[{name!r}] must be a JSON object, got {type(value).__name__}")
    return json.dumps(value, ensure_ascii=False)


def parse_structured_outputs(value: Any) -> dict[str, Any] | None:
    """The checked constraint dict (JSON texts for ``json`` and ``structural_tag``), or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(f"must be a dict with one of {list(CONSTRAINTS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(CONSTRAINTS) - set(OPTIONS))
    if unknown:
        raise _fail(f"has unknown key(s) {unknown}; accepted: {[*CONSTRAINTS, *OPTIONS]}")
    given = [key for key in CONSTRAINTS if value.get(key) is not None]
    if len(given) != 1:
        raise _fail(f"must set exactly one of {list(CONSTRAINTS)}, got {given}")
    (kind,) = given
    constraint = value[kind]
    out: dict[str, Any] = {}
    if kind in ("json", "structural_tag"):
        out[kind] = _json_text(kind, constraint)
        if kind == "structural_tag" and json.loads(out[kind]).get("type") != "structural_tag":
            raise _fail("['structural_tag'] must be {'type': 'structural_tag', 'format': {...}}")
    elif kind in ("regex", "grammar"):
        if not isinstance(constraint, str) or not constraint.strip():
            raise _fail(f"[{kind!r}] must be a non-empty string")
        out[kind] = constraint
    elif kind == "choice":
        if not isinstance(constraint, list) or not constraint:
            raise _fail("['choice'] must be a non-empty list of strings")
        if not all(isinstance(c, str) for c in constraint):
            raise _fail("['choice'] must be a non-empty list of strings")
        out[kind] = list(constraint)
    elif constraint is not True:
        raise _fail("['json_object'] must be true when set")
    else:
        out[kind] = True
    for option in ("disable_any_whitespace", "disable_additional_properties"):
        if value.get(option) is not None:
            if not isinstance(value[option], bool):
                raise _fail(f"[{option!r}] must be true or false")
            out[option] = value[option]
    pattern = value.get("whitespace_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise _fail("['whitespace_pattern'] must be a string")
        out["whitespace_pattern"] = pattern
    return out


def to_vllm_structured(spec: dict[str, Any] | None) -> Any:
    """A fresh ``StructuredOutputsParams`` for one request (vLLM writes its backend into it)."""
    if spec is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    try:
        return StructuredOutputsParams(**spec)
    except Exception as exc:  # vLLM's own checks of the constraint
        raise _fail(f"was refused by vLLM: {exc}") from None


__all__ = ["CONSTRAINTS", "KEY", "OPTIONS", "parse_structured_outputs", "to_vllm_structured"]
