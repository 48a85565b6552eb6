"""``tool_choice`` of a chat request as a decoding constraint (pure: no engine).

``"required"`` and a named tool (``{"type": "function", "function": {"name": ...}}``) become
the sampling param ``structured_outputs`` with an xgrammar structural tag covering the whole
Hermes call: the ``<tool_call>`` token, ``{"name": <an allowed tool>, "arguments": <its
parameters schema>}``, the ``</tool_call>`` token; then only eos may follow. The tag tokens are
matched by id, so the completion still holds only sampled ids, each with its log-prob. One call
per turn. Strings in the call may not contain the text of the tokenizer's added tokens (such
as ``<|im_end|>`` or ``</tool_call>``), which would end the call early.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arctic_platform.rl.agents.chat_tokenizer import ChatTokenizer
from arctic_platform.rl.agents.json_schemas import check_compilable, check_schema
from arctic_platform.rl.agents.tool_calls import TOOL_CALL_END, TOOL_CALL_START
from arctic_platform.rl.errors import BadRequestError

FREE_CHOICES = frozenset({"auto", "none"})
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
MAX_WHITESPACE = 1
"""Most whitespace characters in a row inside the call's JSON (xgrammar needs at least one)."""


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """The function tools of a request by name; 400 for a tool that is not one, or whose
    ``parameters`` is not a valid JSON schema (whatever the ``tool_choice``, as OpenAI)."""
    out: dict[str, Mapping[str, Any]] = {}
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise BadRequestError(f"tools[{i}] must be a function tool with a 'function.name'")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequestError(f"tools[{i}] must be a function tool with a 'function.name'")
        if name in out:
            raise BadRequestError(f"tools[{i}]: a second tool named {name!r}")
        if function.get("parameters") is not None:
            check_schema(function["parameters"], f"tools[{i}].function.parameters")
        out[name] = function
    return out


def forced_tools(
    choice: str | Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]] | None:
    """The functions a turn must call one of (None: the model is free); 400 for a choice that
    names no given tool or is not one OpenAI defines."""
    functions = tool_names(tools)  # every tool is checked, whatever the choice (as OpenAI)
    if choice is None or (isinstance(choice, str) and choice in FREE_CHOICES):
        return None
    if choice == "required":
        if not functions:
            raise BadRequestError("tool_choice 'required' needs at least one tool in 'tools'")
        return list(functions.values())
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or name not in functions:
            raise BadRequestError(
                f"tool_choice names the function {name!r}, which is not among the request's "
                f"tools {sorted(functions)}"
            )
        return [functions[name]]
    raise BadRequestError(
        f"tool_choice {choice!r} is not supported; use 'auto', 'none', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}"
    )


def call_schema(functions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of ``{"name", "arguments"}`` for one of ``functions``."""
    options = []
    for function in functions:
        parameters = function.get("parameters") or EMPTY_PARAMETERS
        where = f"the parameters of tool {function['name']!r}"
        check_compilable(check_schema(parameters, where), where)
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    "arguments": dict(parameters),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def added_token_texts(tokenizer: ChatTokenizer) -> list[str]:
    """The texts of the tokenizer's added tokens (``<|im_end|>``, ``</tool_call>``, ...), which
    strings inside constrained JSON may not contain: they would end the JSON early."""
    added = getattr(tokenizer.raw, "added_tokens_decoder", {}) or {}
    return sorted({str(t.content) for t in added.values() if str(t.content).strip()})


def tool_call_constraint(
    functions: Sequence[Mapping[str, Any]], tokenizer: ChatTokenizer
) -> dict[str, Any]:
    """The ``structured_outputs`` sampling param forcing one Hermes call of ``functions``."""
    start = tokenizer.token_id(TOOL_CALL_START)
    end = tokenizer.token_id(TOOL_CALL_END)
    if start is None or end is None:
        raise BadRequestError(
            f"this model's tokenizer has no single {TOOL_CALL_START} / {TOOL_CALL_END} token, "
            "so tool_choice 'required' or a named tool cannot be enforced; use 'auto'"
        )
    body = {
        "type": "json_schema",
        "json_schema": call_schema(functions),
        "max_whitespace_cnt": MAX_WHITESPACE,
        "excludes": added_token_texts(tokenizer),
    }
    layout = {"type": "regex", "pattern": r"\n?"}
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "token", "token": start},
                layout,
                body,
                layout,
                {"type": "token", "token": end},
            ],
        },
    }
    return {"structural_tag": tag}


__all__ = ["added_token_texts", "call_schema", "forced_tools", "tool_call_constraint", "tool_names"]
