"""ConversationMemory: message records with ids, tool-call pairing under trimming (property
tests), the BaseMemory contract (windows in steps, budgets), state round trips, Recall."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.envs.recall import RecallEnv
from agent_memory.memory import available_memories, make_memory
from agent_memory.memory.conversation import ConversationMemory, Message, select_messages
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import VectorHistoryWrapper


def _call(cid: str, name: str = "look") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def _store(mem, steps: int, env_ids=None, thought: bool = False) -> None:
    ids = list(range(mem.num_envs)) if env_ids is None else list(env_ids)
    for _ in range(steps):
        t = [mem.num_steps(i) + 1 for i in ids]
        record = {
            "observation": [f"obs {s} env {i}" for i, s in zip(ids, t, strict=True)],
            "action": [f"act{s}" for s in t],
        }
        if thought:
            record["thought"] = [f"think{s}" if s % 2 else "" for s in t]
        mem.store(record, env_ids=ids)


def _text(m: dict) -> str:
    out = (m["content"] or "") + "\n"
    if m.get("tool_calls"):
        out += json.dumps(m["tool_calls"], ensure_ascii=False, sort_keys=True) + "\n"
    return out


# ---------------------------------------------------------------------------------- records


def test_store_appends_a_user_and_an_assistant_message_per_step():
    mem = ConversationMemory(2, ids="counter")
    _store(mem, 3, thought=True)
    msgs = mem.messages(0)
    assert [(m.role, m.step) for m in msgs] == [
        ("user", 1),
        ("assistant", 1),
        ("user", 2),
        ("assistant", 2),
        ("user", 3),
        ("assistant", 3),
    ]
    assert msgs[0].content == "obs 1 env 0"
    assert msgs[1].content == "<think>think1</think>\n<action>act1</action>"
    assert msgs[3].content == "act2"  # an empty thought: the bare action
    assert [m.id for m in msgs[:2]] == ["env0-ep1-1", "env0-ep1-2"]
    assert mem[1] == [
        {
            "observation": f"obs {s} env 1",
            "action": f"act{s}",
            "thought": "" if s % 2 == 0 else f"think{s}",
        }
        for s in (1, 2, 3)
    ]
    assert [mem.num_steps(i) for i in range(2)] == [3, 3] and len(mem) == 2


def test_thought_format_and_formatter_templates():
    mem = ConversationMemory(1, thought_format="({thought}) {action}")
    mem.store({"observation": ["o"], "action": ["a"], "thought": ["t"]})
    assert mem.messages(0)[1].content == "(t) a"
    plain = ConversationMemory(1, thought_format=None)
    plain.store({"observation": ["o"], "action": ["a"], "thought": ["t"]})
    assert plain.messages(0)[1].content == "a"
    custom = ConversationMemory(
        1, formatter={"name": "chat", "user_format": "Step {step}: {observation}"}
    )
    custom.store({"observation": ["o"], "action": ["a"]})
    assert custom.messages(0)[0].content == "Step 1: o"


def test_ids_are_unique_and_lookup_is_by_id_and_role():
    mem = ConversationMemory(2)  # uuid ids
    _store(mem, 5)
    ids = [m.id for i in range(2) for m in mem.messages(i)]
    assert len(set(ids)) == len(ids) == 20
    target = mem.messages(1)[5]
    assert mem.get_message(1, target.id) is target
    with pytest.raises(KeyError, match=re.escape(f"env 0 has no message with id {target.id!r}")):
        mem.get_message(0, target.id)
    assert [m.content for m in mem.messages(0, role="user")] == [
        f"obs {s} env 0" for s in range(1, 6)
    ]
    old = mem.messages(0)[0].id
    mem.reset([0])
    assert mem.messages(0) == [] and mem.num_steps(0) == 0 and mem.num_steps(1) == 5
    _store(mem, 1, env_ids=[0])
    assert mem.messages(0)[0].id != old  # a new episode, new ids


def test_add_message_records_every_field():
    mem = ConversationMemory(1, ids="counter", system_prompt="sys")
    _store(mem, 1)
    m = mem.add_message(
        0, "assistant", None, tool_calls=[_call("c1")], name="agent", metadata={"k": [1]}
    )
    r = mem.add_message(0, "tool", "result", tool_call_id="c1", name="look", message_id="mine")
    assert (m.role, m.content, m.tool_calls, m.name, m.metadata, m.step) == (
        "assistant",
        None,
        [_call("c1")],
        "agent",
        {"k": [1]},
        1,
    )
    assert r.id == "mine" and mem.get_message(0, "mine") is r and r.tool_call_id == "c1"
    assert m.timestamp > 0
    assert mem.to_llm_format(0)[-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [_call("c1")], "name": "agent"},
        {"role": "tool", "content": "result", "tool_call_id": "c1", "name": "look"},
    ]
    assert Message.from_dict(json.loads(json.dumps(r.to_dict()))) == r


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (
            ("bot", "x"),
            {},
            ValueError,
            "role must be one of ['assistant', 'system', 'tool', 'user'], got 'bot'",
        ),
        (
            ("user", "x"),
            {"tool_calls": [_call("a")]},
            ValueError,
            "tool_calls are only allowed on assistant messages, got role 'user'",
        ),
        (
            ("assistant", ""),
            {"tool_calls": [{"type": "function"}]},
            ValueError,
            "each tool call must be a mapping with a non-empty string 'id'",
        ),
        (
            ("tool", "x"),
            {},
            ValueError,
            "a tool message needs tool_call_id: the id of the assistant tool call it answers, got None",
        ),
        (
            ("user", "x"),
            {"tool_call_id": "c"},
            ValueError,
            "tool_call_id is only allowed on tool messages, got role 'user'",
        ),
        (("user", 3), {}, TypeError, "content must be a str or None, got int"),
        (
            ("user", "x"),
            {"message_id": "dup"},
            ValueError,
            "message id 'dup' is already used in env 0",
        ),
    ],
)
def test_add_message_refuses_bad_input(args, kwargs, error, message):
    mem = ConversationMemory(1)
    mem.add_message(0, "user", "first", message_id="dup")
    with pytest.raises(error, match=re.escape(message)):
        mem.add_message(0, *args, **kwargs)


# ---------------------------------------------------------------------------------- trimming


def test_tool_exchange_is_kept_or_dropped_whole():
    count = make_token_counter("chars")
    mem = ConversationMemory(1, token_counter="chars", system_prompt="S")
    mem.add_message(0, "user", "u" * 10)
    mem.add_message(0, "assistant", "calling", tool_calls=[_call("a"), _call("b")])
    mem.add_message(0, "tool", "r" * 30, tool_call_id="a")
    mem.add_message(0, "tool", "r" * 30, tool_call_id="b")
    mem.add_message(0, "assistant", "done")
    full = mem.to_llm_format(0)
    assert [m["role"] for m in full] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    total = sum(count(_text(m)) for m in full)
    # A budget that fits the last tool result but not the whole exchange: the exchange goes.
    out = mem.to_llm_format(0, max_history_tokens=total - 12)
    assert [m["role"] for m in out] == ["system", "assistant"] and out[1]["content"] == "done"
    assert [m["role"] for m in mem.to_llm_format(0, max_history_tokens=total - 11)] == [
        "system",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert mem.to_llm_format(0, max_history_tokens=0) == [{"role": "system", "content": "S"}]


def test_unanswered_calls_and_orphan_results_are_left_out():
    mem = ConversationMemory(1)
    mem.add_message(0, "tool", "orphan", tool_call_id="zzz")
    mem.add_message(0, "assistant", "half", tool_calls=[_call("a"), _call("b")])
    mem.add_message(0, "tool", "ra", tool_call_id="a")
    mem.add_message(0, "user", "hi")
    mem.add_message(0, "assistant", None, tool_calls=[_call("c")])  # pending
    assert mem.to_llm_format(0) == [{"role": "user", "content": "hi"}]
    assert len(mem.messages(0)) == 5  # the records stay


ROLES_OPS = st.one_of(
    st.tuples(st.just("user"), st.integers(0, 40)),
    st.tuples(st.just("assistant"), st.integers(0, 40)),
    st.tuples(
        st.just("call"),
        st.lists(st.sampled_from("abcdef"), min_size=1, max_size=3, unique=True),
        st.integers(0, 20),
    ),
    st.tuples(st.just("tool"), st.sampled_from("abcdefg"), st.integers(0, 40)),
)


def _build(system: bool, ops) -> ConversationMemory:
    mem = ConversationMemory(
        1, token_counter="chars", ids="counter", system_prompt="S" * 7 if system else None
    )
    for op in ops:
        if op[0] == "call":
            mem.add_message(0, "assistant", "c" * op[2], tool_calls=[_call(x) for x in op[1]])
        elif op[0] == "tool":
            mem.add_message(0, "tool", "t" * op[2], tool_call_id=op[1])
        else:
            mem.add_message(0, op[0], op[0][0] * op[1])
    return mem


def _check_pairing(out: list[dict]) -> None:
    open_calls: dict[str, int] = {}
    answered: dict[int, set[str]] = {}
    for k, m in enumerate(out):
        if m["role"] == "assistant" and m.get("tool_calls"):
            for tc in m["tool_calls"]:
                open_calls[tc["id"]] = k
            answered[k] = set()
        if m["role"] == "tool":
            # Every result answers a call kept earlier in the list.
            assert m["tool_call_id"] in open_calls
            answered[open_calls[m["tool_call_id"]]].add(m["tool_call_id"])
    for k, got in answered.items():  # every kept call has all its results
        assert got == {tc["id"] for tc in out[k]["tool_calls"]}


@settings(max_examples=300, deadline=None)
@given(system=st.booleans(), ops=st.lists(ROLES_OPS, max_size=25), budget=st.integers(0, 300))
def test_trimming_never_orphans_tool_calls_and_respects_the_budget(system, ops, budget):
    mem = _build(system, ops)
    count = make_token_counter("chars")
    out = mem.to_llm_format(0, max_history_tokens=budget)
    _check_pairing(out)
    if system:
        assert out[0] == {"role": "system", "content": "S" * 7}  # always kept
    cost = sum(count(_text(m)) for m in out)
    assert cost <= budget or (system and len(out) == 1)
    # Reference: brute force over every cut point of the cleaned list.
    msgs = mem.messages(0)
    counts = count.count_many([_text(m.to_llm()) for m in msgs])
    body = 1 if system else 0
    kept, _ = select_messages(msgs, counts, None, lo=body)
    full = mem.to_llm_format(0, max_history_tokens=None)
    assert full[body:] == [msgs[k].to_llm() for k in kept]
    _check_pairing(full)
    sys_cost = counts[0] if system else 0
    best = None
    for s in range(len(kept) + 1):
        suffix = [msgs[k].to_llm() for k in kept[s:]]
        try:
            _check_pairing(suffix)
        except (AssertionError, KeyError):
            continue
        if sys_cost + sum(count(_text(m)) for m in suffix) <= budget:
            best = suffix
            break
    if sys_cost <= budget:
        assert out[body:] == best  # the newest messages that fit, as many as fit


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.lists(ROLES_OPS, max_size=4), min_size=1, max_size=8),
    budget=st.one_of(st.none(), st.integers(0, 400)),
    history_length=st.sampled_from([-1, 1, 2, 5]),
)
def test_fetch_with_tool_messages_keeps_exchanges_and_whole_steps(steps, budget, history_length):
    count = make_token_counter("chars")
    mem = ConversationMemory(1, token_counter="chars", system_prompt="sys")
    for ops in steps:
        mem.store({"observation": ["o" * 5], "action": ["a" * 3]})
        for op in ops:
            if op[0] == "call":
                mem.add_message(0, "assistant", "c", tool_calls=[_call(x) for x in op[1]])
            elif op[0] == "tool":
                mem.add_message(0, "tool", "t" * op[2], tool_call_id=op[1])
            else:
                mem.add_message(0, op[0], op[0][0] * op[1])
    ctx, lengths = mem.fetch(history_length, max_history_tokens=budget)
    out = ctx[0]
    _check_pairing(out)
    assert out[0] == {"role": "system", "content": "sys"}
    if budget is not None:
        assert sum(count(_text(m)) for m in out) <= max(budget, 4)
    # Whole steps: the stored user messages present are the last `lengths` ones.
    observations = [m for m in out if m["role"] == "user" and m["content"] == "o" * 5]
    assert len(observations) == lengths[0]
    if history_length > 0:
        assert lengths[0] <= history_length
    if lengths[0]:
        assert out[1] == {"role": "user", "content": "o" * 5}  # the cut is at a step start


# ---------------------------------------------------------------------------------- fetch


def test_fetch_windows_in_steps_with_the_system_message_first():
    mem = ConversationMemory(2, system_prompt="Be brief.")
    _store(mem, 6)
    ctx, lengths = mem.fetch(2)
    assert lengths == [2, 2]
    assert [m["content"] for m in ctx[1]] == [
        "Be brief.",
        "obs 5 env 1",
        "act5",
        "obs 6 env 1",
        "act6",
    ]
    assert mem.fetch(0) == ([[], []], [0, 0])
    assert mem.fetch(-1).lengths == [6, 6] and len(mem.fetch(-1).contexts[0]) == 13
    assert mem.formatter.output == "messages"


def test_fetch_budget_cuts_at_step_starts_only():
    count = make_token_counter("estimate")
    mem = ConversationMemory(1, max_history_tokens=30, system_prompt="You are an agent.")
    _store(mem, 10)
    ctx, lengths = mem.fetch(-1)  # the memory's default budget
    assert sum(count(_text(m)) for m in ctx[0]) <= 30
    assert [m["role"] for m in ctx[0]] == ["system"] + ["user", "assistant"] * lengths[0]
    assert ctx[0][-1]["content"] == "act10"
    per_step = count("obs 10 env 0\n") + count("act10\n")
    assert lengths[0] == (30 - count("You are an agent.\n")) // per_step
    assert mem.fetch(-1, max_history_tokens=[2]).contexts[0] == [
        {"role": "system", "content": "You are an agent."}
    ]
    assert mem.fetch(3, max_history_tokens=None).lengths == [3]
    with pytest.raises(
        ValueError, match=re.escape("max_history_tokens has 2 budgets, expected 1 (one per env)")
    ):
        mem.fetch(3, max_history_tokens=[1, 2])


def test_messages_added_between_steps_belong_to_the_step_before():
    mem = ConversationMemory(1)
    mem.add_message(0, "user", "instructions")  # before the first step
    _store(mem, 2)
    mem.add_message(0, "user", "a note after step 2")
    _store(mem, 1)
    assert [m.step for m in mem.messages(0)] == [0, 1, 1, 2, 2, 2, 3, 3]
    assert [m["content"] for m in mem.fetch(2).contexts[0]] == [
        "obs 2 env 0",
        "act2",
        "a note after step 2",
        "obs 3 env 0",
        "act3",
    ]
    assert mem.fetch(-1).contexts[0][0]["content"] == "instructions"


def test_capacity_bounds_storage_with_absolute_steps():
    mem = ConversationMemory(1, capacity=3, system_prompt="S", ids="counter")
    _store(mem, 10)
    assert mem.num_steps(0) == 10 and len(mem[0]) <= 6
    assert mem.messages(0)[0].role == "system"
    ctx, lengths = mem.fetch(3)
    assert lengths == [3] and [m["content"] for m in ctx[0][1::2]] == [
        "obs 8 env 0",
        "obs 9 env 0",
        "obs 10 env 0",
    ]
    assert mem.get_message(0, "env0-ep1-20").content == "obs 10 env 0"
    with pytest.raises(
        ValueError,
        match=re.escape("history_length=-1 needs more steps than this memory keeps (capacity=3)"),
    ):
        mem.fetch(-1)


def test_store_checks_record_keys():
    mem = ConversationMemory(1)
    mem.store({"observation": ["o"], "action": ["a"]})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "record keys differ from env 0's episode keys ['action', 'observation']: missing [], unexpected ['thought']"
        ),
    ):
        mem.store({"observation": ["o"], "action": ["a"], "thought": ["t"]})
    mem.store({"action": ["b"], "observation": ["p"]})  # another order is fine
    assert mem[0][-1] == {"observation": "p", "action": "b"}
    with pytest.raises(
        ValueError,
        match=re.escape(
            "the 'chat' formatter needs record keys ['action', 'observation'], got ['action', 'obs']; missing ['observation']"
        ),
    ):
        ConversationMemory(1).store({"obs": ["o"], "action": ["a"]})


# ---------------------------------------------------------------------------------- state, config


def test_state_round_trip_mid_episode_is_exact():
    mem = ConversationMemory(2, ids="counter", system_prompt="S", capacity=4)
    _store(mem, 5, thought=True)
    mem.add_message(1, "assistant", None, tool_calls=[_call("x")], metadata={"m": 1})
    mem.add_message(1, "tool", "res", tool_call_id="x")
    state = json.loads(json.dumps(mem.state_dict()))
    clone = ConversationMemory(2, ids="counter", system_prompt="S", capacity=4)
    clone.load_state_dict(state)
    assert clone.state_dict() == mem.state_dict()
    assert clone.fetch(3) == mem.fetch(3) and clone.fetch(2, max_history_tokens=25) == mem.fetch(
        2, max_history_tokens=25
    )
    for m in (mem, clone):
        _store(m, 6, thought=True)
        m.add_message(0, "user", "note")
    st_a, st_b = mem.state_dict(), clone.state_dict()
    for s in (st_a, st_b):  # timestamps of the later messages differ
        for env in s["envs"]:
            for msg in env["messages"]:
                msg["timestamp"] = 0
    assert st_a == st_b
    assert clone.to_llm_format(1) == mem.to_llm_format(1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "cannot load state: expected kind='ConversationMemory', got 'HistoryMemory'"
        ),
    ):
        clone.load_state_dict(make_memory("history", num_envs=2).state_dict())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"formatter": "simple"},
            "the conversation memory stores chat messages: formatter must have output 'messages' (e.g. 'chat'), got 'simple' (output 'text')",
        ),
        ({"ids": "nanoid"}, "ids must be one of ['uuid', 'counter'], got 'nanoid'"),
        (
            {"thought_format": "{why}"},
            "thought_format may use only {thought} and {action}, got '{why}'",
        ),
        ({"capacity": 0}, "capacity must be None or an int >= 1, got 0"),
        ({"max_history_tokens": -1}, "max_history_tokens must be None or an int >= 0, got -1"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ConversationMemory(1, **kwargs)


def test_registered_and_built_from_the_shared_arguments():
    assert "conversation" in available_memories()
    mem = make_memory(
        "conversation",
        num_envs=2,
        formatter="chat",
        token_counter="chars",
        max_history_tokens=100,
        capacity=None,
        system_prompt="hi",
        ids="counter",
    )
    assert isinstance(mem, ConversationMemory) and mem.max_history_tokens == 100 and len(mem) == 2


# ---------------------------------------------------------------------------------- wrapper


def _recall(memory, history_length: int, seeds: int = 40) -> tuple[float, list]:
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=seeds, vectorization_mode="sync", num_distractors=6
    )
    env = VectorHistoryWrapper(venv, history_length=history_length, memory=memory)
    prompts, info = env.reset(seed=list(range(seeds)))
    reward: list[float | None] = [None] * seeds
    seen = []
    for _ in range(10):
        actions = []
        for i, prompt in enumerate(prompts):
            options = list(info["admissible_actions"][i])
            text = "\n".join(m["content"] for m in prompt)
            actions.append(
                "next" if options == ["next"] else RecallEnv.solve_from_text(text, options)
            )
            if options != ["next"] and i == 0:
                seen.append(prompt)
        prompts, rewards, terminated, truncated, info = env.step(actions)
        for i in np.flatnonzero(terminated | truncated):
            if reward[i] is None:
                reward[i] = float(rewards[i])
        if all(r is not None for r in reward):
            break
    env.close()
    assert all(r is not None for r in reward)
    return float(np.mean(reward)), seen


def test_inside_the_wrapper_on_recall():
    n = 40
    whole, seen = _recall(make_memory("conversation", num_envs=n, ids="counter"), history_length=-1)
    assert whole == 1.0
    question = seen[0]
    assert [m["role"] for m in question] == ["user", "assistant"] * 7 + ["user"]
    assert question[0]["content"].startswith("Remember this:")
    window, _ = _recall(make_memory("conversation", num_envs=n), history_length=2)
    assert window <= 0.5  # the cue is out of the window: chance is 1/4
