"""Tool calls as env actions: which tools an env offers, and the action a response's calls make.

An env declares its tools as OpenAI function schemas in ``info["tools"]`` (at reset; a step's
info may change them), and whether it takes several calls in one response in
``info["parallel_tool_calls"]`` (default false). An env that declares none gets one tool derived
from its admissible actions: ``act(action)``, ``action`` a string, one of the admissible actions
(an ``enum``) where they are known. The calls are read from the response text (the decoded
sampled ids) by :func:`~agent_memory.tool_calls.parse_tool_calls`:

- a call of ``act`` is its ``action`` argument, matched against the admissible actions as an
  ``<action>`` tag's text is;
- a call of an env-declared tool is its canonical text, :func:`call_action`: the JSON
  ``{"arguments": {...}, "name": ...}`` with sorted keys;
- several calls: an ordered list of those actions where the env allows parallel calls, else an
  invalid action;
- calls of the memory's tools (a memory's ``tool_names``) are no env action: they are skipped;
- a malformed block, a call to an unknown tool, arguments the tool does not take, no call at
  all: an invalid action whose reason names it (the env gets the parser's fallback action).

Example:
    >>> from agent_memory.parsing import ActionParser
    >>> text = '<tool_call>{"name": "act", "arguments": {"action": "Left"}}</tool_call>'
    >>> tool_action(ActionParser(), text, ["up", "left"]).action
    'left'
    >>> tool_action(ActionParser(), "I go left", ["up", "left"]).reason
    "no tool call in the response (expected a call to one of: 'act')"
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Literal

from agent_memory.parsing import ActionParser, ParsedAction
from agent_memory.protocol import Generation, SamplingParams
from agent_memory.tool_calls import ToolCall, function_tool, parse_tool_calls

__all__ = [
    "ACT_TOOL",
    "MEMORY_TOOLS",
    "PARALLEL_TOOL_CALLS",
    "TOOLS",
    "act_tool",
    "call_action",
    "check_tools",
    "env_tools",
    "policy_tools",
    "prompt_tools",
    "tool_action",
    "tool_names",
    "tool_needs",
    "with_tools",
]

#: ``info`` key: the env's tools (a list of OpenAI function schemas).
TOOLS: Final = "tools"
#: ``info`` key: whether the env takes several calls in one response (an ordered list).
PARALLEL_TOOL_CALLS: Final = "parallel_tool_calls"
#: ``meta`` key: the tools of the env's memory (``BaseMemory.tools``), offered beside the
#: policy's or env's own (a rollout fills it for a policy that offers tools).
MEMORY_TOOLS: Final = "memory_tools"
#: The name of the tool derived from the admissible actions.
ACT_TOOL: Final = "act"
#: Characters of a call's arguments echoed in a reason.
_ECHO = 60


def act_tool(admissible: Sequence[Any] | None = None) -> dict[str, Any]:
    """The tool derived from an env's admissible actions: ``act(action: string)``, the actions
    as the ``enum`` of ``action`` where they are known.

    Example:
        >>> act_tool(["up", "down"])["function"]["parameters"]["properties"]
        {'action': {'type': 'string', 'enum': ['up', 'down']}}
    """
    action: dict[str, Any] = {"type": "string"}
    if admissible is not None:
        action["enum"] = [str(a) for a in admissible]
    return function_tool(ACT_TOOL, "Take one action in the environment.", {"action": action})


def env_tools(
    declared: Sequence[Mapping[str, Any]] | None, admissible: Sequence[Any] | None
) -> list[dict[str, Any]]:
    """An env's tools: those it declared, else :func:`act_tool` of its admissible actions.

    Example:
        >>> [t["function"]["name"] for t in env_tools(None, ["up"])]
        ['act']
    """
    if declared:
        return [dict(t) for t in declared]
    return [act_tool(admissible)]


def check_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """``tools`` if it is a list of OpenAI function tools (``{"type": "function", "function":
    {"name": ..., ...}}``), names unique.

    Raises:
        ValueError: it is not; the message names ``where`` (the setting or info key).

    Example:
        >>> check_tools([{"type": "function", "function": {"name": "act"}}], "tools")[0]["type"]
        'function'
        >>> check_tools([{"name": "act"}], "policy.params.tools")
        Traceback (most recent call last):
        ...
        ValueError: policy.params.tools[0] must be an OpenAI function tool {"type": "function", \
"function": {"name": ..., "parameters": {...}}} (agent_memory.tool_calls.function_tool builds \
one), got {'name': 'act'}
    """
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence) or not tools:
        raise ValueError(
            f"{where} must be a non-empty list of OpenAI function tools, got {tools!r}"
        )
    seen: set[str] = set()
    out = []
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise ValueError(
                f'{where}[{k}] must be an OpenAI function tool {{"type": "function", "function": '
                '{"name": ..., "parameters": {...}}} (agent_memory.tool_calls.function_tool '
                f"builds one), got {tool!r}"[:400]
            )
        if name in seen:
            raise ValueError(f"{where}: tool {name!r} is declared twice")
        seen.add(name)
        out.append(dict(tool))
    return out


def policy_tools(
    value: Any, where: str = "policy.params.tools"
) -> list[dict[str, Any]] | Literal["env"] | None:
    """A policy's ``tools`` setting checked: None, ``"env"`` (each prompt's env's tools), or a
    list of OpenAI function tools (as plain dicts: a Hydra list is no JSON).

    Example:
        >>> policy_tools("env"), policy_tools(None)
        ('env', None)
        >>> policy_tools("all")
        Traceback (most recent call last):
        ...
        ValueError: policy.params.tools must be a list of OpenAI function schemas or 'env', got \
'all': pass policy.params.tools=env, or a list
    """
    if value is None or value == "env":
        return value
    if isinstance(value, str):
        raise ValueError(
            f"{where} must be a list of OpenAI function schemas or 'env', got {value!r}: pass "
            f"{where}=env, or a list"
        )
    return check_tools(_plain(value), where)


def tool_needs(tools: list[dict[str, Any]] | Literal["env"] | None) -> frozenset[str]:
    """The ``meta`` fields (``Policy.needs``) a policy with the ``tools`` setting needs: each
    env's tools for ``"env"``, and with any tools the memory's (:data:`MEMORY_TOOLS`).

    Example:
        >>> sorted(tool_needs("env")), sorted(tool_needs([act_tool()])), tool_needs(None)
        (['memory_tools', 'tools'], ['memory_tools'], frozenset())
    """
    if tools is None:
        return frozenset()
    return frozenset({TOOLS, MEMORY_TOOLS} if tools == "env" else {MEMORY_TOOLS})


def prompt_tools(
    tools: list[dict[str, Any]] | Literal["env"] | None,
    meta: Sequence[Mapping[str, Any]] | None,
    i: int,
) -> list[dict[str, Any]] | None:
    """Prompt ``i``'s tools under a policy's ``tools`` setting: the list, or its env's
    (``meta[i]["tools"]``, which a rollout fills), then its memory's
    (``meta[i]["memory_tools"]``, where given); None without tools.

    Raises:
        ValueError: ``"env"`` and the prompt's meta holds no tools; a memory tool with the
            name of one of the others.

    Example:
        >>> prompt_tools("env", [{"tools": [act_tool()]}], 0)[0]["function"]["name"]
        'act'
        >>> from agent_memory.tool_calls import function_tool
        >>> meta = [{"memory_tools": [function_tool("memory_delete", "Clear your note.")]}]
        >>> tool_names(prompt_tools([act_tool()], meta, 0))
        ['act', 'memory_delete']
    """
    if tools is None:
        return None
    if tools == "env":
        found = None if meta is None else meta[i].get(TOOLS)
        if not found:
            raise ValueError(
                f"prompt {i}: tools=env offers each env's tools, but its meta holds no 'tools' "
                "(a rollout fills it; a caller passes meta=[{'tools': [...]}, ...])"
            )
        offered = [_plain(t) for t in found]
    else:
        offered = tools
    memory = None if meta is None else meta[i].get(MEMORY_TOOLS)
    if not memory:
        return offered
    clash = sorted(set(tool_names(offered)) & set(tool_names(memory)))
    if clash:
        raise ValueError(
            f"prompt {i}: the memory's tool(s) {clash} have the names of the env's or policy's "
            "tools: rename those (info['tools'] or policy.params.tools), or pass "
            "memory.params.write_with=tags"
        )
    return [*offered, *(_plain(t) for t in memory)]


def _plain(value: Any) -> Any:
    """``value`` in plain dicts and lists (a Hydra DictConfig is a Mapping, not JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def with_tools(generation: Generation, tools: Sequence[Mapping[str, Any]]) -> Generation:
    """``generation`` whose sampling records the ``tools`` its prompt was rendered with.

    Example:
        >>> with_tools(Generation("hi"), [act_tool()]).sampling.tools[:30]
        '[{"type": "function", "functio'
    """
    sampling = generation.sampling or SamplingParams()
    return replace(generation, sampling=replace(sampling, tools=json.dumps(list(tools))))


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of ``tools`` (OpenAI function tools), in order.

    Example:
        >>> tool_names([act_tool()])
        ['act']
    """
    return [str(t["function"]["name"]) for t in tools]


def call_action(call: ToolCall) -> str:
    """The text an env-declared tool's call is sent to the env as: the JSON of the call,
    ``{"arguments": {...}, "name": ...}``, keys sorted (one spelling per call).

    Example:
        >>> call_action(ToolCall("open", {"door": "red", "at": 1}, 0, 9))
        '{"arguments": {"at": 1, "door": "red"}, "name": "open"}'
    """
    return json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=True)


def tool_action(
    parser: ActionParser,
    response: Any,
    admissible: Sequence[Any] | None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    memory_tools: Collection[str] = frozenset(),
    parallel: bool = False,
) -> ParsedAction:
    """The env action of ``response``'s tool calls (see the module docstring); never raises on
    model output.

    Args:
        parser: the env's parser (its length cap, thought tag, matching and fallback).
        response: what the model wrote (the decoded sampled ids).
        admissible: the actions valid now (None: unknown).
        tools: the env's declared tools (None or empty: :func:`act_tool`).
        memory_tools: names of the memory's tools: their calls are no env action.
        parallel: the env takes several calls as an ordered list of actions.

    Example:
        >>> from agent_memory.tool_calls import format_tool_call
        >>> two = format_tool_call("act", {"action": "up"}) * 2
        >>> tool_action(ActionParser(), two, ["up"], parallel=True).action
        ['up', 'up']
        >>> tool_action(ActionParser(), two, ["up"]).reason[:48]
        '2 tool calls in the response, expected 1 (the en'
    """
    text = parser.checked_text(response)
    if isinstance(text, ParsedAction):
        return text
    thought = parser.thought_of(text)
    offered = env_tools(tools, admissible)
    names = tool_names(offered)
    parsed = parse_tool_calls(text, known=[*names, *memory_tools])
    if parsed.errors:
        return parser.invalid(parsed.errors[0].reason, thought)
    calls = [c for c in parsed.calls if c.name not in memory_tools]
    if not calls:
        listed = ", ".join(repr(n) for n in names)
        skipped = len(parsed.calls)
        what = f"only calls to the memory's tools ({skipped})" if skipped else "no tool call"
        return parser.invalid(
            f"{what} in the response (expected a call to one of: {listed})", thought
        )
    if len(calls) > 1 and not parallel:
        return parser.invalid(
            f"{len(calls)} tool calls in the response, expected 1 (the env takes no parallel "
            f"calls: its info[{PARALLEL_TOOL_CALLS!r}] is not true)",
            thought,
        )
    schemas = {str(t["function"]["name"]): t["function"] for t in offered}
    actions: list[Any] = []
    for call in calls:
        one = _one_action(parser, call, schemas[call.name], admissible, derived=not tools)
        if isinstance(one, str):
            return parser.invalid(one, thought)
        actions.append(one)
    if len(actions) == 1:
        action = actions[0]
        return ParsedAction(action[0], action[1], True, None, thought)
    return ParsedAction(
        [a[0] for a in actions], json.dumps([a[1] for a in actions]), True, None, thought
    )


def _one_action(
    parser: ActionParser,
    call: ToolCall,
    schema: Mapping[str, Any],
    admissible: Sequence[Any] | None,
    *,
    derived: bool,
) -> tuple[Any, str] | str:
    """One call's ``(env action, text as the history shows it)``, or why it is none
    (``derived``: the tool is :func:`act_tool`, its ``action`` is matched as a tag's text)."""
    wrong = _argument_error(call, schema)
    if wrong is not None:
        return wrong
    if not derived:
        text = call_action(call)
        return text, text
    chosen = parser.choose(call.arguments["action"], admissible)
    if not chosen.valid:
        return str(chosen.reason)
    return chosen.action, chosen.text


def _argument_error(call: ToolCall, schema: Mapping[str, Any]) -> str | None:
    """Why ``call``'s arguments are not what ``schema`` takes (a required one missing, one it
    does not name, a string where a string is declared), or None."""
    parameters = schema.get("parameters")
    if not isinstance(parameters, Mapping):
        return None
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    echo = json.dumps(call.arguments)
    echo = echo if len(echo) <= _ECHO else echo[:_ECHO] + "..."
    where = f"malformed arguments of {call.name!r} ({echo})"
    missing = [k for k in parameters.get("required") or () if k not in call.arguments]
    if missing:
        return f"{where}: missing {', '.join(map(repr, missing))}"
    extra = [k for k in call.arguments if k not in properties]
    if properties and extra and parameters.get("additionalProperties", False) is False:
        return (
            f"{where}: {', '.join(map(repr, extra))} not among {', '.join(map(repr, properties))}"
        )
    for key, value in call.arguments.items():
        declared = properties.get(key)
        if (
            isinstance(declared, Mapping)
            and declared.get("type") == "string"
            and not isinstance(value, str)
        ):
            return f"{where}: {key!r} must be a string, got {type(value).__name__}"
    return None
