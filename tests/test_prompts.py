"""PromptTemplate: fields, defaults, validation."""

from __future__ import annotations

import pickle
import re

import pytest

from agent_memory.prompts import TAG_INSTRUCTIONS, PromptTemplate, action_instructions


def test_with_and_without_history():
    t = PromptTemplate(
        no_history="{task}|{observation}|{admissible_actions}",
        with_history="{task}|{step_count}|{history_length}|{history}|{current_step}|{observation}",
        task="default task",
    )
    assert t.render(observation="o", admissible=["a", "b"]) == 'default task|o|"a", "b"'
    assert (
        t.render(observation="o", task="T", history="H", history_length=2, step_count=7)
        == "T|7|2|H|8|o"
    )
    assert t.render(observation="o", admissible=None) == "default task|o|"


def test_literal_braces_and_action_format():
    t = PromptTemplate(
        no_history='{{"json": true}} {admissible_actions}', action_quote="'", action_separator="\n "
    )
    assert t.render(observation="", admissible=["x", "y"]) == "{\"json\": true} 'x'\n 'y'"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"no_history": "{obs}"},
            "prompt template 'no_history' uses unknown field(s) ['obs']: expected some of ['action_instructions', 'admissible_actions', 'current_step', 'history', 'history_length', 'memory_instructions', 'observation', 'step_count', 'task']",
        ),
        ({"no_history": "{}"}, "prompt template 'no_history' uses a positional field '{}'"),
        (
            {"no_history": "{observation"},
            "prompt template 'no_history' is not a valid format string",
        ),
        (
            {"with_history": "{observation}"},
            "prompt template 'with_history' must contain {history}",
        ),
        ({"system": "{nope}"}, "prompt template 'system' uses unknown field(s) ['nope']"),
    ],
)
def test_bad_templates_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PromptTemplate(**kwargs)


def test_from_config():
    assert PromptTemplate.from_config(None).no_history == PromptTemplate().no_history
    assert PromptTemplate.from_config("{observation}!").render(observation="x") == "x!"
    assert PromptTemplate.from_config({"task": "t"}).task == "t"
    with pytest.raises(
        TypeError,
        match=re.escape("prompt template must be a PromptTemplate, a mapping or a string, got int"),
    ):
        PromptTemplate.from_config(3)


@pytest.mark.parametrize("history", [None, "", "step 1\n%(task)s {x} 100%"])
def test_the_compiled_text_writes_what_format_map_writes(history):
    t = PromptTemplate(task="Push {the} box: 100% %s")
    fields = {"observation": "#@ $.# {obs} %d", "admissible": ["up", 'say "hi"', "{}"]}
    words = "\n\nWrite {a} note: 100% %s"
    got = t.render(
        **fields, history=history, history_length=2, step_count=7, memory_instructions=words
    )
    text = t.no_history if history is None else t.with_history
    want = text.format_map(
        {
            "task": t.task,
            "observation": fields["observation"],
            "admissible_actions": '"up", "say "hi"", "{}"',
            "history": history or "",
            "history_length": 2,
            "step_count": 7,
            "current_step": 8,
            "action_instructions": TAG_INSTRUCTIONS,
            "memory_instructions": words,
        }
    )
    assert got == want


def test_a_format_spec_falls_back_to_format_map_and_templates_pickle():
    t = PromptTemplate(no_history="{observation} at {step_count:03d}")
    assert t.render(observation="o", step_count=4) == "o at 004"
    u = pickle.loads(pickle.dumps(PromptTemplate(task="t")))
    assert u.render(observation="o", admissible=["a"]) == PromptTemplate(task="t").render(
        observation="o", admissible=["a"]
    )


def test_cached_action_lists_keep_numbers_of_other_types_apart():
    t = PromptTemplate()
    assert t.format_actions([1, 2]) == '"1", "2"'
    assert t.format_actions([True, 2]) == '"True", "2"'
    assert t.format_actions(["a", "b"]) == t.format_actions(("a", "b")) == '"a", "b"'
    assert t.format_actions([["unhashable"]]) == "\"['unhashable']\""


def test_the_default_template_without_tool_calls_is_the_text_it_was():
    # The default prompt, byte for byte as before {action_instructions} (its default).
    t = PromptTemplate(task="T")
    assert t.render(observation="o", admissible=["a"], memory_instructions="\n\nM") == (
        'T\n\nYour current observation is:\no\n\nYour admissible actions are: "a".\n\n'
        "Think step by step inside <think> </think> tags, then give exactly one admissible action "
        "inside <action> </action> tags.\n\nM"
    )
    assert t.render(observation="o", history="H", history_length=1, step_count=1).endswith(
        "Your admissible actions are: .\n\nThink step by step inside <think> </think> tags, then "
        "give exactly one admissible action inside <action> </action> tags."
    )


def test_with_tool_calls_the_default_template_asks_for_the_call_the_parser_reads():
    t = PromptTemplate(task="T")
    call = '<tool_call>{"name": "act", "arguments": {"action": "your action"}}</tool_call>'
    act = t.render(observation="o", action_instructions=action_instructions(True))
    assert "<action>" not in act
    assert act.endswith(f"then give exactly one admissible action as a call of act: {call}.")
    declared = action_instructions(True, declared=True)
    assert declared.endswith("then make exactly one call of one of your tools.")
    parallel = action_instructions(True, declared=True, parallel=True)
    assert parallel.endswith("then call your tools (one or more calls, taken in order).")
    assert action_instructions(True, parallel=True).endswith(
        f"then give one or more admissible actions, each as a call of act: {call}."
    )
    system = PromptTemplate(system="{task}: {action_instructions}", task="T")
    assert system.render_system(action_instructions=declared) == f"T: {declared}"
    assert system.render_system() == f"T: {TAG_INSTRUCTIONS}"
