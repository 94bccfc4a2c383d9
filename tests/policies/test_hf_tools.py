"""``policy=hf`` with ``tools``: the chat template renders the tools into the prompt ids, and the
generations record them (their rows' ``tools``)."""

from __future__ import annotations

import json
import re

import pytest

from agent_memory.tool_actions import act_tool

pytest.importorskip("torch", reason="the 'llm' extra is not installed")

TOOLS = [act_tool(["up", "down"])]
CHAT = [{"role": "user", "content": "Where?"}]


@pytest.fixture(scope="module")
def policy(qwen):
    from agent_memory.policies.hf import HFPolicy

    with HFPolicy(qwen, max_new_tokens=3, seed=0, tools="env") as p:
        yield p


def test_the_prompt_ids_are_the_template_rendered_with_each_envs_tools(policy):
    other = [act_tool(["left"])]
    first, second = policy.generate(["Where?", "Where?"], [{"tools": TOOLS}, {"tools": other}])
    tok = policy.tokenizer
    for g, tools in ((first, TOOLS), (second, other)):
        assert g.prompt_ids == tok.apply_chat_template(
            CHAT, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert json.loads(g.sampling.tools) == tools
    assert policy.needs == frozenset({"tools", "memory_tools"})


def test_the_memorys_tools_are_rendered_after_the_envs(policy):
    from agent_memory.memory.note_tools import memory_tools

    notes = memory_tools("append", 32)
    (g,) = policy.generate(["Where?"], [{"tools": TOOLS, "memory_tools": notes}])
    assert json.loads(g.sampling.tools) == TOOLS + notes
    assert g.prompt_ids == policy.tokenizer.apply_chat_template(
        CHAT, tools=TOOLS + notes, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_tools_env_without_the_prompts_tools_is_refused(policy):
    with pytest.raises(ValueError, match=re.escape("prompt 0: tools=env offers each env's tools")):
        policy.generate(["Where?"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"tools": TOOLS, "incremental": True},
            "tools are never rendered incrementally: pass policy.params.incremental=false",
        ),
        (
            {"tools": "all"},
            "policy.params.tools must be a list of OpenAI function schemas or 'env'",
        ),
    ],
)
def test_tools_the_policy_cannot_render_are_refused_before_the_model_loads(qwen, settings, message):
    from agent_memory.policies.hf import HFPolicy

    with pytest.raises(ValueError, match=re.escape(message)):
        HFPolicy(qwen, max_new_tokens=3, **settings)


def test_tools_without_a_chat_template_are_refused(qwen):
    from agent_memory.policies.hf import HFPolicy

    with pytest.raises(
        ValueError,
        match=re.escape(
            "tools are rendered by the chat template: pass policy.params.use_chat_template=auto "
            "with a model whose tokenizer has one, or remove policy.params.tools"
        ),
    ):
        HFPolicy(qwen, max_new_tokens=3, tools=TOOLS, use_chat_template=False)
