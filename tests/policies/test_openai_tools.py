"""``policy.params.tools``: the requests offer tools, the answers' tool calls are read from the
decoded sampled ids and checked against a vLLM-style server's structured ``tool_calls`` (the
mock server answers as vLLM's ``--tool-call-parser hermes`` does), and the rows record the tools
the prompt was rendered with. Against the real vLLM: tests/policies/test_vllm_tools.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agent_memory.parsing import ActionParser
from agent_memory.policies.openai_client import OpenAIPolicy
from agent_memory.tool_actions import act_tool, tool_action
from agent_memory.tool_calls import format_tool_call
from tests.policies.test_openai import FAST

URL = "http://127.0.0.1:1/v1"  # nothing is sent: the policy refuses when built
ADMISSIBLE = ["up", "down"]
TOOLS = [act_tool(ADMISSIBLE)]
CALL = format_tool_call("act", {"action": "down"})


def _server(answer: str) -> Any:
    from mock_server import HashBackend, MockOpenAIServer

    return MockOpenAIServer(HashBackend(lambda prompt, seed: answer))


@pytest.fixture(scope="module")
def served(qwen):
    """A vLLM-style mock server with the Qwen2.5 tokenizer answering ``answer[0]``, and a
    policy offering :data:`TOOLS` (both built once: the tokenizer takes seconds to load)."""
    from mock_server import HashBackend, MockOpenAIServer

    answer = [CALL]
    backend = HashBackend(lambda prompt, seed: answer[0], tokenizer_path=qwen)
    with (
        MockOpenAIServer(backend) as server,
        OpenAIPolicy(server.base_url, "hash", tokenizer=qwen, tools=TOOLS, max_retries=0) as p,
    ):
        yield answer, p


def test_calls_are_read_from_the_sampled_ids_and_rows_record_the_tools(served):
    # Content null and the call in tool_calls, as vLLM answers: the text is the ids' decoding.
    answer, policy = served
    tok = policy.renderer.tokenizer  # the Qwen2.5 tokenizer the mock server uses too
    answer[0] = "Going down. " + CALL
    (g,) = policy.generate(["Where to?"])
    assert policy.last_stats.failures == 0
    assert g.text == tok.decode(g.response_ids, skip_special_tokens=True) == "Going down. " + CALL
    # The prompt ids the server rendered WITH the tools (checked against the local rendering).
    chat = [{"role": "user", "content": "Where to?"}]
    assert g.prompt_ids == tok.apply_chat_template(
        chat, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert "<tools>" in tok.decode(g.prompt_ids)
    assert json.loads(g.sampling.tools) == TOOLS and g.sampling.tool_choice is None
    parsed = tool_action(ActionParser(), g.text, ADMISSIBLE)
    assert (parsed.valid, parsed.action, parsed.thought) == (True, "down", "")


def test_a_server_whose_tool_calls_disagree_with_the_ids_fails_the_request_counted(
    served, monkeypatch
):
    import mock_server.responses as responses

    real = responses.hermes_calls

    def other_call(text: str) -> Any:  # a server whose parser reads another call
        content, calls = real(text)
        for c in calls:
            c["function"]["arguments"] = '{"action": "up"}'
        return content, calls

    monkeypatch.setattr(responses, "hermes_calls", other_call)
    answer, policy = served
    answer[0] = CALL
    (g,) = policy.generate(["Where to?"])
    assert policy.last_stats.tool_call_mismatches == policy.last_stats.failures == 1
    assert g.failed and g.text == ""
    assert (
        "the server's tool_calls are not the calls its sampled ids decode to (server: "
        'act({"action": "up"}); decoded: act({"action": "down"});'
    ) in str(g.error)


def test_a_malformed_call_is_the_text_and_the_wrappers_name_it(served):
    # vLLM's parser takes an unclosed block as a call; the text is kept, and the action invalid.
    unclosed = '<tool_call>{"name": "act", "arguments": {"action": "up"}}'
    answer, policy = served
    answer[0] = unclosed
    (g,) = policy.generate(["Where to?"])
    assert policy.last_stats.failures == 0
    assert g.text == unclosed
    parsed = tool_action(ActionParser(), g.text, ADMISSIBLE)
    assert parsed.reason == "unclosed <tool_call> at character 0"


def test_text_only_the_calls_are_written_back_in_the_hermes_format():
    with (
        _server(CALL) as server,
        OpenAIPolicy(server.base_url, "hash", tools=TOOLS, tool_choice="auto", **FAST) as policy,
    ):
        (g,) = policy.generate(["Where to?"])
    assert g.text == CALL and g.sampling.tool_choice == "auto"
    assert tool_action(ActionParser(), g.text, ADMISSIBLE).action == "down"


def test_tools_env_offers_each_prompts_own_tools():
    from tests.policies.test_openai import serve

    other = [act_tool(["left"])]
    with serve() as server:
        policy = OpenAIPolicy(server.base_url, "m", tools="env", **FAST)
        assert policy.needs == frozenset({"tools", "memory_tools"})
        policy.act(["a", "b"], [{"tools": TOOLS}, {"tools": other}])
        policy.close()
        bodies = sorted(server.bodies(), key=lambda b: b["messages"][0]["content"])
    assert [b["tools"] for b in bodies] == [TOOLS, other]
    assert all("tool_choice" not in b for b in bodies)


@pytest.mark.parametrize("setting", ["env", "list"])
def test_the_memorys_tools_are_offered_after_the_env_or_policy_tools(setting):
    from agent_memory.memory.note_tools import memory_tools
    from tests.policies.test_openai import serve

    notes = memory_tools("replace", 64)
    meta = [{"tools": TOOLS, "memory_tools": notes}, {"tools": TOOLS}]
    with serve() as server:
        policy = OpenAIPolicy(
            server.base_url, "m", tools=TOOLS if setting == "list" else "env", **FAST
        )
        assert "memory_tools" in policy.needs  # the rollout fills it
        gens = policy.generate(["a", "b"], meta)
        policy.close()
        bodies = sorted(server.bodies(), key=lambda b: b["messages"][0]["content"])
    assert [b["tools"] for b in bodies] == [TOOLS + notes, TOOLS]
    assert [json.loads(g.sampling.tools) for g in gens] == [TOOLS + notes, TOOLS]  # as sent


def test_a_memory_tool_named_as_an_env_tool_is_refused_naming_both_fixes():
    from agent_memory.memory.note_tools import memory_tools

    notes = memory_tools("replace", 64)
    policy = OpenAIPolicy(URL, "m", tools="env", **FAST)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "prompt 0: the memory's tool(s) ['memory_write'] have the names of the env's or "
            "policy's tools: rename those (info['tools'] or policy.params.tools), or pass "
            "memory.params.write_with=tags"
        ),
    ):
        policy.generate(["a"], [{"tools": [notes[0]], "memory_tools": notes}])
    policy.close()


def test_tools_env_without_the_prompts_tools_is_refused():
    policy = OpenAIPolicy(URL, "m", tools="env", **FAST)
    with pytest.raises(ValueError, match=re.escape("prompt 0: tools=env offers each env's tools")):
        policy.generate(["a"], [{"traj_uid": "t", "step": 1}])
    policy.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"tools": TOOLS, "tool_choice": "required"},
            "tool_choice must be 'auto', 'none' or null, got 'required': a call forced by "
            "tool_choice is decoded under a grammar",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "act"}}},
            "tool_choice must be 'auto', 'none' or null, got {'type': 'function'",
        ),
        ({"tool_choice": "auto"}, "tool_choice='auto' without tools: set policy.params.tools"),
        (
            {"tools": TOOLS, "mode": "completion"},
            "tools are rendered by the chat template: pass policy.params.mode=chat",
        ),
        (
            {"tools": TOOLS, "return_tokens": True},
            "tools with return_tokens=true need policy.params.tokenizer",
        ),
        ({"tools": "all"}, "tools must be a list of OpenAI function schemas or 'env', got 'all'"),
        (
            {"tools": [{"name": "act"}]},
            'policy.params.tools[0] must be an OpenAI function tool {"type": "function"',
        ),
    ],
)
def test_tool_settings_that_cannot_hold_are_refused_when_built(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy(URL, "m", **{**FAST, **settings})


def test_without_tools_nothing_changes_in_the_request():
    from tests.policies.test_openai import serve

    with serve() as server, OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        (g,) = policy.generate(["a"])
        (body,) = server.bodies()
    assert "tools" not in body and "tool_choice" not in body
    assert g.sampling.tools is None and g.sampling.tool_choice is None
