"""Reading a model's answer into OpenAI `tool_calls`, as vLLM's Hermes parser does, and the
grammars that force a call."""

from __future__ import annotations

import json

import pytest

from dlscale.errors import InvalidField
from dlscale.frontends.rest.openai.tools import ToolUse, read_calls, response_guide, tool_use

PAINT = [{"type": "function", "function": {"name": "paint", "parameters": {"type": "object"}}}]
AUTO = ToolUse("auto", names=("paint",))


def test_hermes_tags_become_calls_and_the_rest_content() -> None:
    text = 'Sure. <tool_call>{"name": "paint", "arguments": {"color": "red"}}</tool_call>'
    content, [call] = read_calls(text, AUTO)
    assert content == "Sure." and call.name == "paint"
    assert json.loads(call.arguments) == {"color": "red"}


def test_two_calls_and_no_content() -> None:
    one = '<tool_call>{"name": "paint", "arguments": {}}</tool_call>'
    content, calls = read_calls(one + "\n" + one, AUTO)
    assert content is None and [c.name for c in calls] == ["paint", "paint"]


@pytest.mark.parametrize(
    "text",
    [
        "just words",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "draw", "arguments": {}}</tool_call>',  # not one of the tools
        '<tool_call>{"name": "paint", "arguments": {}}',  # never closed
    ],
)
def test_what_is_no_call_stays_content(text: str) -> None:
    assert read_calls(text, AUTO) == (text, [])


def test_tool_choice_none_reads_nothing() -> None:
    _, use, guide = tool_use(PAINT, "none")
    assert not use.parsed and guide is None


def test_forced_calls_get_grammars() -> None:
    _, named, guide = tool_use(PAINT, {"type": "function", "function": {"name": "paint"}})
    assert named.mode == "named" and guide is not None
    assert json.loads(guide.schema) == {"type": "object"}
    assert read_calls('{"a": 1}', named)[1][0].arguments == '{"a": 1}'
    _, required, guide = tool_use(PAINT, "required")
    assert guide is not None and json.loads(guide.schema)["minItems"] == 1
    content, [call] = read_calls('[{"name": "paint", "arguments": {"b": 2}}]', required)
    assert content is None and json.loads(call.arguments) == {"b": 2}
    assert read_calls('[{"name": "paint", "argu', required) == ('[{"name": "paint", "argu', [])


def test_response_formats() -> None:
    assert response_guide({"type": "text"}) is None
    assert response_guide({"type": "json_object"}).kind == "json_object"  # type: ignore[union-attr]
    with pytest.raises(InvalidField) as caught:
        response_guide({"type": "json_schema", "json_schema": {"schema": {"minLength": "x"}}})
    assert caught.value.param == "response_format.json_schema.schema"
