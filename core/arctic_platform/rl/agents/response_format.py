"""``response_format`` of a chat request as a decoding constraint (pure: no engine).

``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` constrains the answer
to JSON valid against ``schema`` (any JSON object when it has none); ``{"type":
"json_object"}`` to a JSON object; ``{"type": "text"}`` leaves decoding free. The constraint is
an xgrammar structural tag around the schema, as for forced tool calls: whitespace runs are
bounded and strings may not hold the text of the tokenizer's added tokens, so a small or
untrained model cannot wander in blanks or end the answer from inside a string. The answer's
ids are still the sampled ids, each with its log-prob.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.json_schemas import check_compilable, check_schema
from arctic_platform.rl.agents.tool_choice import MAX_WHITESPACE, added_token_texts
from arctic_platform.rl.errors import BadRequestError

TYPES = ("text", "json_object", "json_schema")
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def response_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema ``response_format`` asks the answer to follow (None: free text);
    400 for a format OpenAI does not define or a schema that is not a JSON object."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping) or response_format.get("type") not in TYPES:
        raise BadRequestError(f"response_format must be an object whose 'type' is one of {TYPES}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(ANY_OBJECT)
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise BadRequestError("response_format of type 'json_schema' needs a 'json_schema' object")
    where = "response_format.json_schema.schema"
    schema = check_schema(spec.get("schema", ANY_OBJECT), where)
    check_compilable(schema, where)
    return schema


def response_format_constraint(
    response_format: Any, tokenizer: ChatTokenizer
) -> dict[str, Any] | None:
    """The ``structured_outputs`` sampling param of ``response_format``, or None."""
    schema = response_schema(response_format)
    if schema is None:
        return None
    body = {
        "type": "json_schema",
        "json_schema": schema,
        "max_whitespace_cnt": MAX_WHITESPACE,
        "excludes": added_token_texts(tokenizer),
    }
    return {"structural_tag": {"type": "structural_tag", "format": body}}


__all__ = ["response_format_constraint", "response_schema"]
