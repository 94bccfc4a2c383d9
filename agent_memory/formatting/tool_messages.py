"""Tool calls in a chat history: the assistant turn keeps the calls the model wrote as
``tool_calls``, and the observation after them goes back as a ``tool`` message, which the model's
chat template renders (Qwen2.5's as ``<tool_response>``). Used by the ``chat`` formatter with
``tool_messages=True`` and by the prompt's current turn.

Example:
    >>> turn = assistant_turn('ok <tool_call>{"name": "act", "arguments": {"action": "up"}}'
    ...                       '</tool_call>', "up", 3)
    >>> turn["content"], turn["tool_calls"][0]["function"]
    ('ok', {'name': 'act', 'arguments': {'action': 'up'}})
    >>> tool_result(turn, "A wall.")
    {'role': 'tool', 'content': 'A wall.', 'tool_call_id': 'call_3_0', 'name': 'act'}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_memory.tool_calls import parse_tool_calls

__all__ = ["as_tool_results", "assistant_turn", "tool_result"]


def assistant_turn(response: str, action: str, step: int) -> dict[str, Any]:
    """The assistant message of a step: with the response's well-formed calls as ``tool_calls``
    (ids ``call_<step>_<k>``) and the text around them as content; without calls, ``action``
    (what the step stored) as content, as the ``chat`` formatter writes it.

    Example:
        >>> assistant_turn("no call here", "up", 1)
        {'role': 'assistant', 'content': 'up'}
    """
    parsed = parse_tool_calls(response)
    if not parsed.calls:
        return {"role": "assistant", "content": action}
    calls = [
        {
            "id": f"call_{step}_{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for k, c in enumerate(parsed.calls)
    ]
    return {"role": "assistant", "content": parsed.content, "tool_calls": calls}


def tool_result(after: Mapping[str, Any], content: str) -> dict[str, Any]:
    """The ``tool`` message answering the assistant message ``after`` (its first call named).

    Example:
        >>> call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": {}}}
        >>> tool_result({"role": "assistant", "tool_calls": [call]}, "A key.")["tool_call_id"]
        'c1'
    """
    call = after["tool_calls"][0]
    return {
        "role": "tool",
        "content": content,
        "tool_call_id": call["id"],
        "name": call["function"]["name"],
    }


def as_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each user message that follows an assistant message with tool calls
    made the ``tool`` message answering them (in place; returned).

    Example:
        >>> calls = [{"id": "c", "type": "function", "function": {"name": "act", "arguments": {}}}]
        >>> chat = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "",
        ...         "tool_calls": calls}, {"role": "user", "content": "B"}]
        >>> [m["role"] for m in as_tool_results(chat)]
        ['user', 'assistant', 'tool']
    """
    for k in range(1, len(messages)):
        before, m = messages[k - 1], messages[k]
        if m.get("role") == "user" and before.get("tool_calls"):
            messages[k] = tool_result(before, m["content"])
    return messages
