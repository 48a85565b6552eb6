"""The JSON schemas a chat request carries (a tool's ``parameters``, a ``json_schema``
response format), checked before anything is sampled.

``check_schema``: a JSON object that is a valid JSON schema (its meta-schema, via
``jsonschema``), else a 400 naming where and why, as OpenAI and vLLM refuse it.
``check_compilable``: a schema that decoding will enforce must also compile into a grammar
(xgrammar, the engine's backend): a 400 with xgrammar's own reason instead of the engine's
terse "Invalid grammar specification". Without xgrammar installed here the engine still
refuses it, later.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from arctic_platform.rl.errors import BadRequestError

_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")
"""The ``[time] file.cc:line:`` head of xgrammar's messages (not the caller's concern)."""


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """``schema`` as a dict; 400 when it is not a JSON object or not a valid JSON schema."""
    if not isinstance(schema, Mapping):
        raise BadRequestError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    reason = _schema_error(json.dumps(schema, sort_keys=True))
    if reason is not None:
        raise BadRequestError(f"{where} is not a valid JSON schema: {reason}")
    return dict(schema)


@functools.lru_cache(maxsize=256)
def _schema_error(text: str) -> str | None:
    """Why the JSON schema ``text`` is not valid against its meta-schema (None: it is); a
    request's schemas are checked more than once (its checks, then its sampling params)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    schema = json.loads(text)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        at = "/".join(str(p) for p in exc.path)
        return exc.message + (f" (at '{at}')" if at else "")
    return None


def check_compilable(schema: Mapping[str, Any], where: str) -> None:
    """400 when ``schema`` (already valid) cannot be compiled into a decoding grammar."""
    reason = _compile_error(json.dumps(schema, sort_keys=True))
    if reason is not None:
        raise BadRequestError(
            f"{where} cannot be enforced by constrained decoding: {reason}; simplify the schema "
            "or send tool_choice 'auto'"
        )


@functools.lru_cache(maxsize=256)
def _compile_error(text: str) -> str | None:
    """xgrammar's reason for refusing the schema ``text`` (None: it compiles, or xgrammar is
    not installed in this process)."""
    try:
        import xgrammar
    except ImportError:
        return None
    try:
        xgrammar.Grammar.from_json_schema(text)
    except (RuntimeError, ValueError) as exc:
        return _LOCATION.sub("", str(exc).strip()) or type(exc).__name__
    return None


__all__ = ["check_compilable", "check_schema"]
