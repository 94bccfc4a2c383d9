"""The hermes tool-call parser: spans, order, and a named error for every malformed block."""

from __future__ import annotations

import json

import pytest

from agent_memory.tool_calls import (
    MAX_CALLS,
    format_tool_call,
    function_tool,
    parse_tool_calls,
)


def test_calls_keep_their_order_and_spans_and_the_rest_is_content():
    a = format_tool_call("move", {"to": "north"})
    b = format_tool_call("take", {"item": "key"})
    text = f"I go. {a} then {b}"
    parsed = parse_tool_calls(text, known={"move", "take"})
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("move", {"to": "north"}),
        ("take", {"item": "key"}),
    ]
    assert [text[c.start : c.end] for c in parsed.calls] == [a, b]
    assert parsed.errors == ()
    assert parsed.content == "I go.  then"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("[1, 2]", "expected a JSON object in <tool_call>, actual list: '[1, 2]'"),
        ('{"arguments": {}}', "expected a string 'name' in <tool_call>, actual None:"),
        ('{"name": "move", "arguments": [1]}', "as the arguments of 'move', actual list"),
        ('{"name": "move", "arguments": "{x"}', "malformed JSON in the arguments of 'move'"),
        (
            '{"name": "mvoe", "arguments": {}}',
            "unknown tool 'mvoe' (known: 'move', 'take'); did you mean move?",
        ),
    ],
)
def test_each_malformed_block_is_a_named_error_and_never_a_call(body, reason):
    text = f"<tool_call>{body}</tool_call>"
    parsed = parse_tool_calls(text, known=["move", "take"])
    assert parsed.calls == ()
    (error,) = parsed.errors
    assert reason in error.reason
    assert (error.start, error.end) == (0, len(text))


def test_an_unknown_tool_error_names_the_tool():
    (error,) = parse_tool_calls('<tool_call>{"name": "fly"}</tool_call>', known=[]).errors
    assert error.name == "fly"
    assert error.reason == "unknown tool 'fly' (known: none)"


def test_an_unclosed_block_ends_the_parse_as_an_error():
    text = format_tool_call("a", {}) + ' <tool_call>{"name": "b"}'
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.calls] == ["a"]
    assert parsed.errors[0].reason == f"unclosed <tool_call> at character {text.index(' <') + 1}"


def test_calls_past_the_bound_are_errors_not_work():
    text = format_tool_call("a", {}) * (MAX_CALLS + 3)
    parsed = parse_tool_calls(text)
    assert len(parsed.calls) == MAX_CALLS
    assert [e.reason for e in parsed.errors] == [
        f"more than {MAX_CALLS} tool calls in one response"
    ] * 3


def test_arguments_written_as_a_json_string_are_read():
    body = json.dumps({"name": "a", "arguments": json.dumps({"x": 1})})
    assert parse_tool_calls(f"<tool_call>{body}</tool_call>").calls[0].arguments == {"x": 1}


def test_a_hostile_response_costs_linear_time_and_never_raises():
    text = "<tool_call>" * 100_000  # one opening with no closing: one unclosed error
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and len(parsed.errors) == 1


def test_a_function_tool_is_what_the_openai_api_takes():
    tool = function_tool("act", "Take one action.", {"action": {"type": "string", "enum": ["a"]}})
    assert tool == {
        "type": "function",
        "function": {
            "name": "act",
            "description": "Take one action.",
            "parameters": {
                "type": "object",
                "properties": {"action": {"type": "string", "enum": ["a"]}},
                "required": ["action"],
            },
        },
    }
