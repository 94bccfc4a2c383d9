"""Formatters: verl-agent byte identity, code cap, chat messages, jinja templates, the registry."""

from __future__ import annotations

import re

import pytest

from agent_memory import HistoryMemory
from agent_memory.formatting import (
    CodeFormatter,
    Formatter,
    JinjaFormatter,
    available_formatters,
    make_formatter,
    register_formatter,
)

OBS = ["You see a desk", "It's dark: 'quotes' and\nnewlines", "", "ünïcode ✓"]
ACT = ["go to desk 1", "look", "", "take key"]


def _memory(fmt, n_steps: int = 4, **kw) -> HistoryMemory:
    mem = HistoryMemory(1, fmt, **kw)
    for t in range(n_steps):
        mem.store({"observation": [OBS[t % 4]], "action": [ACT[t % 4]]})
    return mem


def test_simple_matches_verl_agent_lines():
    ctx = _memory("simple").fetch(3).contexts[0]
    expected = "\n".join(
        f"[Observation {k}: '{OBS[k - 1]}', Action {k}: '{ACT[k - 1]}']" for k in (2, 3, 4)
    )
    assert ctx == expected


def test_search_matches_verl_agent_lines():
    ctx = _memory("search").fetch(2).contexts[0]
    assert ctx == f"Step 3:{ACT[2]} {OBS[2]}\n\nStep 4:{ACT[3]} {OBS[3]}\n"


def test_code_matches_appworld_history_and_caps_from_the_front():
    full = "".join(
        f"\nCode {k}: \n{ACT[k - 1]}\n\nResult {k}: \n{OBS[k - 1]}\n" for k in (1, 2, 3, 4)
    )
    assert _memory({"name": "code", "max_chars": None}).fetch(-1).contexts[0] == full
    capped = _memory({"name": "code", "max_chars": 30}).fetch(-1).contexts[0]
    assert capped == "... " + full[-30:]
    assert _memory("code").fetch(-1).contexts[0] == full  # under the default 10000 cap
    with pytest.raises(
        ValueError, match=re.escape("max_chars must be None or an int >= 0, got -1")
    ):
        CodeFormatter(max_chars=-1)


def test_chat_gives_alternating_messages():
    msgs = _memory("chat").fetch(2).contexts[0]
    assert msgs == [
        {"role": "user", "content": OBS[2]},
        {"role": "assistant", "content": ACT[2]},
        {"role": "user", "content": OBS[3]},
        {"role": "assistant", "content": ACT[3]},
    ]
    assert _memory("chat").fetch(0).contexts[0] == []
    fmt = make_formatter(
        "chat", assistant_format="<action>{action}</action>", user_format="[{step}] {observation}"
    )
    assert fmt.render({"observation": "o", "action": "a"}, 7) == [
        {"role": "user", "content": "[7] o"},
        {"role": "assistant", "content": "<action>a</action>"},
    ]


def test_chat_budget_counts_message_contents():
    mem = _memory("chat", token_counter="chars")
    tokens = mem.step_tokens(0)
    assert tokens[0] == len(OBS[0]) + 1 + len(ACT[0]) + 1
    assert mem.fetch(-1, max_history_tokens=tokens[-1]).lengths == [1]


def test_jinja_default_template_and_fields(tmp_path):
    mem = HistoryMemory(1, {"name": "jinja", "max_steps": 20})
    mem.store({"thought": ["sum first"], "action": ["x = 1 + 2"], "result": ["3"]})
    mem.store({"thought": [""], "action": ["print(x)"], "result": ["3"]})
    assert mem.fetch(-1).contexts[0] == (
        "Step 1/20:\nThought: sum first\nAction: x = 1 + 2\nResult: 3\n"
        "Step 2/20:\nAction: print(x)\nResult: 3"
    )
    obs_only = JinjaFormatter().render({"observation": "dark", "action": "light"}, 3)
    assert obs_only == "Step 3:\nAction: light\nObservation: dark"
    path = tmp_path / "step.j2"
    path.write_text("#{{ step }} {{ record.action | upper }} -> {{ observation }}")
    assert (
        JinjaFormatter(template_file=path).render({"observation": "o", "action": "a"}, 2)
        == "#2 A -> o"
    )


def test_jinja_errors_are_clear(tmp_path):
    with pytest.raises(
        ValueError, match=re.escape("invalid jinja step template (line 1): unexpected '}'")
    ):
        JinjaFormatter(template="{{ step }")
    fmt = JinjaFormatter(template="{{ acton }}")
    with pytest.raises(
        KeyError,
        match=re.escape(
            "jinja step template uses an undefined name ('acton' is undefined); the record has keys ['action']"
        ),
    ):
        fmt.render({"action": "a"}, 1)
    with pytest.raises(FileNotFoundError, match=re.escape("is not a file")):
        JinjaFormatter(template_file=tmp_path / "missing.j2")
    with pytest.raises(
        ValueError, match=re.escape("give either template or template_file, not both")
    ):
        JinjaFormatter(template="x", template_file=tmp_path / "x")


def test_jinja_runs_sandboxed():
    fmt = JinjaFormatter(template="{{ record.__class__.__mro__ }}")
    with pytest.raises(Exception, match=r"unsafe|access"):
        fmt.render({"action": "a"}, 1)


def test_registry_adds_user_formatters_by_name():
    @register_formatter("test-upper")
    class Upper(Formatter):
        def render(self, record, step):
            return f"{step}:{record['action'].upper()}"

    assert "test-upper" in available_formatters()
    mem = HistoryMemory(1, "test-upper")
    mem.store({"action": ["go"]})
    mem.store({"action": ["stop"]})
    assert mem.fetch(-1).contexts == ["1:GO\n2:STOP"]
    with pytest.raises(
        ValueError, match=re.escape("a formatter named 'test-upper' is already registered")
    ):
        register_formatter("test-upper", lambda: Upper())
    assert make_formatter({"name": "test-upper"}).render({"action": "x"}, 1) == "1:X"


def test_make_formatter_errors():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "unknown formatter 'nope': expected one of ['chat', 'code', 'jinja', 'search', 'simple'"
        ),
    ):
        make_formatter("nope")
    with pytest.raises(
        ValueError,
        match=re.escape("a formatter mapping needs a 'name' key, got keys ['max_chars']"),
    ):
        make_formatter({"max_chars": 3})
    with pytest.raises(
        TypeError,
        match=re.escape("formatter must be a registered name, a mapping or a Formatter, got int"),
    ):
        make_formatter(3)


def test_custom_keys():
    mem = HistoryMemory(1, {"name": "simple", "obs_key": "text_obs", "action_key": "act"})
    mem.store({"text_obs": ["o"], "act": ["a"]})
    assert mem.fetch(1).contexts == ["[Observation 1: 'o', Action 1: 'a']"]
