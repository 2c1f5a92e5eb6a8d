"""OpenAI's `tools`, `tool_choice` and `response_format`: checked, turned into a grammar, and
the model's answer read back into `tool_calls`.

The chat template renders the tools (the engine passes them to it); what the model answers is
read as vLLM's Hermes parser reads it: each `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` is a call, the text around them the content. `tool_choice: "required"` or a
named function constrains the answer with a JSON-schema grammar, as vLLM does: a list of calls,
or the named function's arguments. Schemas are checked with `jsonschema` at the door, so that
a malformed one is a 400 naming its field, before it reaches an engine.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from dlscale.errors import InvalidField
from dlscale.sampling import Guide

#: OpenAI's bounds: at most 128 tools, names of 1 to 64 letters, digits, '_' and '-'.
MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Hermes's tool-call tags, as vLLM's `hermes` parser reads them.
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolUse:
    """How the answer may call tools: `mode` none, auto, required or named (`name`)."""

    mode: str = "none"
    name: str = ""
    names: tuple[str, ...] = ()

    @property
    def parsed(self) -> bool:
        """Whether the answer is read for tool calls (else it is plain content)."""
        return self.mode != "none"


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: a function's name and its arguments (JSON text)."""

    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": "call_" + uuid.uuid4().hex[:24],
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def response_guide(value: object) -> Guide | None:
    """`response_format`: None for text, a Guide for json_object and json_schema."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidField("response_format", "response_format must be an object with a type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json_object")
    if kind != "json_schema":
        raise InvalidField(
            "response_format.type",
            f"response_format.type must be text, json_object or json_schema, not {kind!r}",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise InvalidField(
            "response_format.json_schema",
            "response_format.json_schema must be an object with a name and a schema object",
        )
    schema = spec.get("schema", _ANY_OBJECT)
    _check_schema(schema, "response_format.json_schema.schema")
    return Guide("json_schema", json.dumps(schema))


def tool_use(tools: object, choice: object) -> tuple[str, ToolUse, Guide | None]:
    """The tools as JSON for the template, how they may be called, and the grammar that
    forces a call (tool_choice required or named; None otherwise)."""
    functions = _functions(tools)
    if choice is None:
        choice = "auto" if functions else "none"
    if functions == [] and choice != "none":
        raise InvalidField("tool_choice", "tool_choice needs tools: none were given")
    names = tuple(f["name"] for f in functions)
    if choice in ("none", "auto", "required"):
        use = ToolUse(str(choice), names=names)
    else:
        use = ToolUse("named", _named(choice, names), names)
    guide = _forcing(use, functions)
    text = json.dumps([{"type": "function", "function": f} for f in functions]) if names else ""
    return text, use, guide


def read_calls(text: str, use: ToolUse) -> tuple[str | None, list[ToolCall]]:
    """The content and the tool calls in a finished answer, as vLLM reads them."""
    if use.mode == "named":
        return None, [ToolCall(use.name, text)]
    if use.mode == "required":
        calls = _listed_calls(text, use)
        return (None, calls) if calls else (text, [])
    if use.mode != "auto" or "<tool_call>" not in text:
        return text, []
    calls = [c for c in (_tagged(m) for m in _CALL.findall(text)) if c and c.name in use.names]
    if not calls:
        return text, []
    content = _CALL.sub("", text).strip()
    return content or None, calls


def _functions(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InvalidField("tools", f"tools must be a list of at most {MAX_TOOLS} functions")
    functions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidField(
                f"{where}.type", f'{where} must be {{"type": "function", "function"}}'
            )
        function = tool.get("function")
        if not isinstance(function, dict) or not _NAME.match(str(function.get("name", ""))):
            raise InvalidField(
                f"{where}.function.name",
                f"{where}.function needs a name of 1 to 64 letters, digits, '_' or '-'",
            )
        parameters = function.get("parameters", _ANY_OBJECT)
        _check_schema(parameters, f"{where}.function.parameters")
        kept = {"name": function["name"], "parameters": parameters}
        if isinstance(function.get("description"), str):
            kept["description"] = function["description"]
        functions.append(kept)
    return functions


def _named(choice: object, names: tuple[str, ...]) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or name is None:
        raise InvalidField(
            "tool_choice",
            'tool_choice must be none, auto, required or {"type": "function", "function": '
            '{"name": ...}}',
        )
    if name not in names:
        raise InvalidField("tool_choice", f"tool_choice names {name!r}, which is not in tools")
    return str(name)


def _forcing(use: ToolUse, functions: list[dict[str, Any]]) -> Guide | None:
    """vLLM's grammars for a forced call: the named function's arguments, or a list of calls."""
    if use.mode == "named":
        [function] = [f for f in functions if f["name"] == use.name]
        return Guide("json_schema", json.dumps(function["parameters"]))
    if use.mode != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return Guide("json_schema", json.dumps(schema))


def _listed_calls(text: str, use: ToolUse) -> list[ToolCall]:
    try:
        listed = json.loads(text)
    except json.JSONDecodeError:  # cut by max_tokens: the text stays content
        return []
    calls = [_call(item) for item in listed] if isinstance(listed, list) else []
    return [c for c in calls if c is not None and c.name in use.names]


def _tagged(body: str) -> ToolCall | None:
    try:
        return _call(json.loads(body))
    except json.JSONDecodeError:
        return None


def _call(item: object) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    return ToolCall(item["name"], json.dumps(arguments))


def _check_schema(schema: object, param: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidField(param, f"{param} must be a JSON schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidField(param, f"{param} is not a valid JSON schema: {exc.message}") from None
