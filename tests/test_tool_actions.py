"""Tool calls as env actions (``agent_memory.tool_actions``), and through the wrappers: each
failure an invalid step whose reason names it, never the model's call lost as ``""``."""

from __future__ import annotations

import json
import re
import string
from typing import Any

import gymnasium as gym
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from agent_memory.memory.notes import NotesMemory
from agent_memory.parsing import ActionParser
from agent_memory.tool_actions import act_tool, call_action, check_tools, env_tools, tool_action
from agent_memory.tool_calls import format_tool_call, function_tool, parse_tool_calls
from agent_memory.wrappers import VectorHistoryWrapper

ADMISSIBLE = ["up", "down", "left"]
OPEN = function_tool("open", "Open a door.", {"door": {"type": "string"}})


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


@pytest.mark.parametrize(
    ("response", "action"),
    [
        (call("act", action="up"), "up"),
        (call("act", action=" Left. "), "left"),  # matched as a tag's text is
        ("<think>go down</think>" + call("act", action="down"), "down"),
        ('<tool_call>{"name": "act", "arguments": "{\\"action\\": \\"up\\"}"}</tool_call>', "up"),
    ],
)
def test_a_call_of_the_derived_act_tool_is_its_action(response, action):
    parsed = tool_action(ActionParser(), response, ADMISSIBLE)
    assert (parsed.valid, parsed.action, parsed.text) == (True, action, action)


def test_the_thought_outside_the_call_is_kept():
    parsed = tool_action(
        ActionParser(), "<think>box left</think>" + call("act", action="left"), ADMISSIBLE
    )
    assert parsed.thought == "box left"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("I go up", "no tool call in the response (expected a call to one of: 'act')"),
        ("<action>up</action>", "no tool call in the response (expected a call to one of: 'act')"),
        (call("fly", to="moon"), "unknown tool 'fly' (known: 'act')"),
        ("<tool_call>{oops</tool_call>", "malformed JSON in <tool_call> (Expecting property name"),
        (
            '<tool_call>{"name": "act", "arguments": {"action": "up"}}',
            "unclosed <tool_call> at character 0",
        ),
        (
            '<tool_call>{"name": "act", "arguments": "{up"}</tool_call>',
            "malformed JSON in the arguments of 'act'",
        ),
        (
            call("act", move="up"),
            "malformed arguments of 'act' ({\"move\": \"up\"}): missing 'action'",
        ),
        (
            call("act", action=3),
            "malformed arguments of 'act' ({\"action\": 3}): 'action' must be a string, got int",
        ),
        (
            call("act", action="up", speed=2),
            "malformed arguments of 'act' ({\"action\": \"up\", \"speed\": 2}): 'speed' not among 'action'",
        ),
        (call("act", action="jump"), "'jump' is not admissible (up, down, left)"),
        (call("act", action=""), "empty action"),
        (
            call("act", action="up") + call("act", action="down"),
            "2 tool calls in the response, expected 1 (the env takes no parallel calls: its "
            "info['parallel_tool_calls'] is not true)",
        ),
        (  # a valid call beside a malformed one: the answer is invalid, the fault named
            call("act", action="up") + "<tool_call>[1]</tool_call>",
            "expected a JSON object in <tool_call>, actual list: '[1]'",
        ),
    ],
)
def test_each_failure_is_an_invalid_action_whose_reason_names_it(response, reason):
    parsed = tool_action(ActionParser(), response, ADMISSIBLE)
    assert not parsed.valid and parsed.action is None
    assert parsed.reason.startswith(reason), parsed.reason
    assert parsed.text == f"[invalid: {parsed.reason}]"


def test_parallel_calls_are_an_ordered_list_where_the_env_takes_them():
    response = call("act", action="down") + "\n" + call("act", action="Up")
    parsed = tool_action(ActionParser(), response, ADMISSIBLE, parallel=True)
    assert (parsed.valid, parsed.action, parsed.text) == (True, ["down", "up"], '["down", "up"]')
    # One bad call spoils the list: it is named.
    bad = tool_action(
        ActionParser(), response + call("act", action="fly"), ADMISSIBLE, parallel=True
    )
    assert bad.reason == "'fly' is not admissible (up, down, left)"


def test_env_declared_tools_send_the_calls_canonical_json():
    response = call("open", door="red")
    parsed = tool_action(ActionParser(), response, None, [OPEN])
    assert parsed.valid and parsed.action == '{"arguments": {"door": "red"}, "name": "open"}'
    # act is no tool of an env that declares its own.
    wrong = tool_action(ActionParser(), call("act", action="up"), None, [OPEN])
    assert wrong.reason == "unknown tool 'act' (known: 'open')"


def test_memory_tools_are_skipped_when_choosing_the_action():
    memory = frozenset({"note_write"})
    response = call("note_write", text="key is red") + call("act", action="up")
    parsed = tool_action(ActionParser(), response, ADMISSIBLE, memory_tools=memory)
    assert parsed.valid and parsed.action == "up"
    only = tool_action(
        ActionParser(), call("note_write", text="x"), ADMISSIBLE, memory_tools=memory
    )
    assert only.reason == (
        "only calls to the memory's tools (1) in the response (expected a call to one of: 'act')"
    )


def test_hostile_responses_are_invalid_not_raised():
    parser = ActionParser(max_chars=100)
    assert tool_action(parser, None, ADMISSIBLE).reason == "no response (None)"
    assert tool_action(parser, "x" * 101, ADMISSIBLE).reason.startswith("response too long")
    many = "<tool_call>" * 10_000
    assert not tool_action(ActionParser(), many, ADMISSIBLE).valid


def test_the_derived_tool_and_declared_tools():
    assert env_tools(None, ["a"]) == [act_tool(["a"])]
    assert env_tools([OPEN], ["a"]) == [OPEN]
    assert act_tool(None)["function"]["parameters"]["properties"] == {"action": {"type": "string"}}
    (parsed,) = parse_tool_calls(call("open", door="ré", at=1)).calls
    assert call_action(parsed) == '{"arguments": {"at": 1, "door": "r\\u00e9"}, "name": "open"}'


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("act", "tools must be a non-empty list of OpenAI function tools, got 'act'"),
        ([], "tools must be a non-empty list of OpenAI function tools, got []"),
        ([{"name": "act"}], 'tools[0] must be an OpenAI function tool {"type": "function"'),
        ([OPEN, OPEN], "tools: tool 'open' is declared twice"),
    ],
)
def test_malformed_tool_lists_are_refused(tools, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_tools(tools, "tools")


# ---------------------------------------------------------------------- through the wrappers


class Doors(gym.Env):
    """Declares a tool of its own (or none: ``act`` is derived) and records what step() gets."""

    observation_space = spaces.Text(256, min_length=0, charset=string.printable)
    action_space = spaces.Text(256, min_length=0, charset=string.printable)

    def __init__(self, declare: bool = True, parallel: bool = False) -> None:
        self.declare, self.parallel, self.received = declare, parallel, []

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"admissible_actions": ["open", "wait"]}
        if self.declare:
            info["tools"] = [OPEN]
        info["parallel_tool_calls"] = self.parallel
        return info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "A closed door.", self._info()

    def step(self, action):
        self.received.append(action)
        return "Still a door.", 0.0, False, False, self._info()


def _wrapped(**kwargs: Any) -> tuple[VectorHistoryWrapper, list[Doors]]:
    envs = [Doors(**kwargs), Doors(**kwargs)]
    venv = SyncVectorEnv([lambda e=e: e for e in envs], autoreset_mode=AutoresetMode.NEXT_STEP)
    wrapper = VectorHistoryWrapper(venv, parser=ActionParser(tool_calls=True), formatter="chat")
    wrapper.reset(seed=0)
    return wrapper, envs


def test_an_env_gets_its_declared_tools_calls_through_a_vector_env():
    env, inner = _wrapped()
    assert env.current(0).tools == (OPEN,)
    _, _, _, _, info = env.step([call("open", door="red"), "open"])
    assert info["is_action_valid"].tolist() == [True, False]
    assert (
        info["invalid_reason"][1]
        == "no tool call in the response (expected a call to one of: 'open')"
    )
    assert inner[0].received == ['{"arguments": {"door": "red"}, "name": "open"}']
    assert inner[1].received == [""]  # the fallback, not the model's text
    assert json.loads(info["parsed_action"][0]) == {"name": "open", "arguments": {"door": "red"}}
    env.close()


def test_the_derived_act_tool_and_parallel_calls_through_a_vector_env():
    env, inner = _wrapped(declare=False, parallel=True)
    assert env.current(0).tools is None
    both = call("act", action="wait") + call("act", action="open")
    _, _, _, _, info = env.step([both, call("act", action="jump")])
    assert info["is_action_valid"].tolist() == [True, False]
    assert inner[0].received == [["wait", "open"]]
    assert info["invalid_reason"][1] == "'jump' is not admissible (open, wait)"
    assert env.memory[0][0]["action"] == '["wait", "open"]'
    env.close()


def test_an_env_that_declares_a_malformed_tool_list_fails_at_reset_naming_the_key():
    class Bad(Doors):
        def _info(self):
            return {"tools": [{"name": "open"}]}

    venv = SyncVectorEnv([Bad], autoreset_mode=AutoresetMode.NEXT_STEP)
    env = VectorHistoryWrapper(venv, parser=ActionParser(tool_calls=True))
    with pytest.raises(
        ValueError, match=re.escape('info["tools"][0] must be an OpenAI function tool')
    ):
        env.reset(seed=0)
    env.close()


def test_a_saved_session_keeps_each_envs_tools(tmp_path):
    env, _ = _wrapped(parallel=True)
    path = env.save_session(tmp_path / "s.json")
    again, _ = _wrapped(declare=False)
    assert again.current(0).tools is None
    again.load_session(path)
    assert again.current(0).tools == (OPEN,)
    both = call("open", door="a") + call("open", door="b")
    _, _, _, _, info = again.step([both, both])
    assert info["is_action_valid"].tolist() == [True, True]  # parallel, as saved
    env.close()
    again.close()


def test_the_default_prompt_asks_for_the_call_each_env_takes():
    declared, _ = _wrapped()
    derived, _ = _wrapped(declare=False, parallel=True)
    tagged = VectorHistoryWrapper(
        SyncVectorEnv([Doors], autoreset_mode=AutoresetMode.NEXT_STEP), parser=ActionParser()
    )
    tagged.reset(seed=0)
    (turn,) = declared.prompts[0]
    assert turn["content"].endswith("then make exactly one call of one of your tools.")
    (turn,) = derived.prompts[0]
    assert turn["content"].endswith(
        "then give one or more admissible actions, each as a call of act: "
        '<tool_call>{"name": "act", "arguments": {"action": "your action"}}</tool_call>.'
    )
    assert tagged.prompts[0].endswith(
        "give exactly one admissible action inside <action> </action> tags."
    )
    for env in (declared, derived, tagged):
        env.close()


def test_with_tool_calls_the_notes_ask_for_the_write_before_the_actions_call():
    venv = SyncVectorEnv([lambda: Doors(declare=False)], autoreset_mode=AutoresetMode.NEXT_STEP)
    notes = NotesMemory(num_envs=1, write_with="tools")
    env = VectorHistoryWrapper(venv, parser=ActionParser(tool_calls=True), memory=notes)
    prompts, _ = env.reset(seed=0)
    assert (
        "admissible action as a call of act: <tool_call>"
        '{"name": "act", "arguments": {"action": "your action"}}</tool_call>.\n\n'
        "You keep a note for later steps. Before your action's tool call, write <tool_call>"
        '{"name": "memory_write", "arguments": {"text": "your note"}}</tool_call>: each '
        "memory_write call replaces your note"
    ) in prompts[0]
    env.close()
