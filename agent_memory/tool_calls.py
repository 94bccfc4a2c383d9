"""Tool calls in a response's text: the hermes format Qwen2.5's chat template writes and vLLM's
``hermes`` tool parser reads.

A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (JSON between the tags,
whitespace around it allowed). The sampled ids decode to this text whether the server returned
the calls as ``tool_calls`` (content ``null``) or not, so one parser over the decoded text serves
every policy, and each call keeps its character span (for token masks). Every malformed block is
a named :class:`ToolCallError`, never a silent drop: this module never raises on model output.

Example:
    >>> text = 'ok <tool_call>{"name": "move", "arguments": {"to": "north"}}</tool_call>'
    >>> parsed = parse_tool_calls(text + '<tool_call>{"name": "fly"}</tool_call>', known=["move"])
    >>> [(c.name, c.arguments) for c in parsed.calls]
    [('move', {'to': 'north'})]
    >>> parsed.errors[0].reason
    "unknown tool 'fly' (known: 'move')"
    >>> parsed.content
    'ok'
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from agent_memory.suggest import did_you_mean

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "ParsedToolCalls",
    "ToolCall",
    "ToolCallError",
    "format_tool_call",
    "function_tool",
    "parse_tool_calls",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
#: Calls read from one response at most (each one past it is an error: bounded work).
MAX_CALLS = 64
#: Characters of a malformed call echoed in its reason.
_ECHO = 60


class ToolCall(NamedTuple):
    """One well-formed call.

    Attributes:
        name: the function's name.
        arguments: its arguments (a JSON object).
        start, end: the character span of the whole ``<tool_call>…</tool_call>`` block.
    """

    name: str
    arguments: dict[str, Any]
    start: int
    end: int


class ToolCallError(NamedTuple):
    """One block that is not a call this parser accepts, and why (``reason`` names it)."""

    reason: str
    start: int
    end: int
    name: str | None = None


class ParsedToolCalls(NamedTuple):
    """What :func:`parse_tool_calls` found: calls and errors in text order, and the rest.

    Attributes:
        calls: the well-formed calls to known tools.
        errors: every block that is not one.
        content: the text outside the blocks, stripped (what the model said besides calling).
    """

    calls: tuple[ToolCall, ...]
    errors: tuple[ToolCallError, ...]
    content: str


def _echo(body: str) -> str:
    body = " ".join(body.split())
    return repr(body if len(body) <= _ECHO else body[:_ECHO] + "...")


def _read(body: str, known: Collection[str] | None) -> tuple[str, dict[str, Any]] | str:
    """A block's ``(name, arguments)``, or the reason it is none."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return f"malformed JSON in <tool_call> ({err.msg}): {_echo(body)}"
    if not isinstance(value, dict):
        return (
            f"expected a JSON object in <tool_call>, actual {type(value).__name__}: {_echo(body)}"
        )
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f"expected a string 'name' in <tool_call>, actual {name!r}: {_echo(body)}"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return f"malformed JSON in the arguments of {name!r} ({err.msg}): {_echo(body)}"
    if not isinstance(arguments, dict):
        kind = type(arguments).__name__
        return f"expected a JSON object as the arguments of {name!r}, actual {kind}"
    if known is not None and name not in known:
        hint = did_you_mean(name, known)
        listed = ", ".join(repr(k) for k in sorted(known)) or "none"
        return f"unknown tool {name!r} (known: {listed})" + (f"; {hint}" if hint else "")
    return name, arguments


def parse_tool_calls(
    text: str, *, known: Collection[str] | None = None, max_calls: int = MAX_CALLS
) -> ParsedToolCalls:
    """The hermes-format tool calls in ``text``, each malformed block a named error.

    Args:
        text: a response's text (the decoded sampled ids).
        known: the tool names declared; a call to another one is an error (None: any name).
        max_calls: blocks read at most; each one past it is an error.

    Example:
        >>> parse_tool_calls('<tool_call>{"name": "a", "arguments": "{}"}</tool_call>').calls
        (ToolCall(name='a', arguments={}, start=0, end=55),)
        >>> parse_tool_calls("<tool_call>{oops</tool_call>").errors[0].reason
        "malformed JSON in <tool_call> (Expecting property name enclosed in double quotes): '{oops'"
        >>> parse_tool_calls('<tool_call>{"name": "a"}').errors[0].reason
        'unclosed <tool_call> at character 0'
    """
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    rest: list[str] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            rest.append(text[pos:])
            break
        rest.append(text[pos:start])
        close = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if close < 0:  # no closing after this opening, so none after any later one either
            errors.append(
                ToolCallError(f"unclosed {CALL_OPEN} at character {start}", start, len(text))
            )
            break
        end = close + len(CALL_CLOSE)
        pos = end
        if len(calls) + len(errors) >= max_calls:
            errors.append(
                ToolCallError(f"more than {max_calls} tool calls in one response", start, end)
            )
            continue
        read = _read(text[start + len(CALL_OPEN) : close], known)
        if isinstance(read, str):
            name = None
            if read.startswith("unknown tool"):
                name = read.split("'", 2)[1]
            errors.append(ToolCallError(read, start, end, name))
        else:
            calls.append(ToolCall(read[0], read[1], start, end))
    return ParsedToolCalls(tuple(calls), tuple(errors), "".join(rest).strip())


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as the hermes format writes it (what a model is taught to write; the inverse of
    :func:`parse_tool_calls`).

    Example:
        >>> format_tool_call("move", {"to": "north"})
        '<tool_call>\\n{"name": "move", "arguments": {"to": "north"}}\\n</tool_call>'
    """
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def function_tool(
    name: str, description: str, properties: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """An OpenAI function tool (an entry of a chat request's ``tools``), all properties required.

    Example:
        >>> tool = function_tool("act", "Take an action.", {"action": {"type": "string"}})
        >>> tool["function"]["parameters"]
        {'type': 'object', 'properties': {'action': {'type': 'string'}}, 'required': ['action']}
    """
    props = {k: dict(v) for k, v in (properties or {}).items()}
    parameters = {"type": "object", "properties": props, "required": list(props)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }
