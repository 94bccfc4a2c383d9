"""Tool calls in the chat history (``chat`` formatter, ``tool_messages=True``): the assistant turn
keeps its ``tool_calls``, the observation after them is a ``tool`` message, and the model's chat
template renders both (Qwen2.5: ``<tool_call>`` and ``<tool_response>``). Without the option the
chat formatter's messages are what they were."""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from agent_memory.formatting import make_formatter
from agent_memory.parsing import ActionParser
from agent_memory.tool_calls import format_tool_call
from agent_memory.wrappers import VectorHistoryWrapper

CALL = format_tool_call("act", {"action": "left"})


class Corridor(gym.Env):
    observation_space = spaces.Text(256, min_length=0, charset=string.printable)
    action_space = spaces.Text(256, min_length=0, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "Start.", {"admissible_actions": ["left", "right"]}

    def step(self, action):
        self.t += 1
        return f"Moved {action} ({self.t}).", 0.0, False, False, {"admissible_actions": ["left"]}


def _prompts(formatter: Any, responses: list[str]) -> list[Any]:
    venv = SyncVectorEnv([Corridor], autoreset_mode=AutoresetMode.NEXT_STEP)
    env = VectorHistoryWrapper(
        venv, history_length=-1, formatter=formatter, parser=ActionParser(tool_calls=True)
    )
    prompts, _ = env.reset(seed=0)
    out = [prompts[0]]
    for r in responses:
        prompts, *_ = env.step([r])
        out.append(prompts[0])
    env.close()
    return out


def test_a_call_stays_a_call_and_its_observation_comes_back_as_a_tool_message():
    fmt = make_formatter({"name": "chat", "tool_messages": True})
    *_, prompt = _prompts(fmt, ["Going left. " + CALL, "no call at all"])
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool", "assistant", "user"]
    assistant, tool = prompt[1], prompt[2]
    assert assistant["content"] == "Going left."
    assert assistant["tool_calls"] == [
        {
            "id": "call_1_0",
            "type": "function",
            "function": {"name": "act", "arguments": {"action": "left"}},
        }
    ]
    assert tool == {
        "role": "tool",
        "content": "Moved left (1).",
        "tool_call_id": "call_1_0",
        "name": "act",
    }
    # An invalid answer (no call) is the stored action, as the chat formatter writes it.
    assert prompt[3] == {
        "role": "assistant",
        "content": "[invalid: no tool call in the response (expected a call to one of: 'act')]",
    }


def test_the_current_observation_answers_the_last_steps_call():
    fmt = make_formatter({"name": "chat", "tool_messages": True})
    _, prompt = _prompts(fmt, [CALL])
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool"]
    assert prompt[-1]["tool_call_id"] == "call_1_0" and "Moved left (1)." in prompt[-1]["content"]


def test_without_tool_messages_the_chat_is_what_it_was():
    *_, prompt = _prompts("chat", [CALL])
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert prompt[1] == {"role": "assistant", "content": "left"}
    assert (
        make_formatter("chat").config
        == make_formatter({"name": "chat"}).config
        == {
            "obs_key": "observation",
            "action_key": "action",
            "user_format": None,
            "assistant_format": None,
        }
    )


def test_qwens_chat_template_renders_the_calls_and_the_tool_response(qwen):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen, local_files_only=True)
    fmt = make_formatter({"name": "chat", "tool_messages": True})
    _, prompt = _prompts(fmt, [CALL])
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "act", "arguments": {"action": "left"}}\n</tool_call>' in text
    response = text.split("<tool_response>\n", 1)[1]
    assert "Moved left (1)." in response.split("</tool_response>")[0]


@pytest.mark.parametrize("response", ["<tool_call>{oops</tool_call>", "plain"])
def test_a_response_without_a_well_formed_call_is_a_plain_assistant_turn(response):
    fmt = make_formatter({"name": "chat", "tool_messages": True})
    (_user, assistant) = fmt.render({"observation": "o", "action": "a", "response": response}, 1)
    assert assistant == {"role": "assistant", "content": "a"}
