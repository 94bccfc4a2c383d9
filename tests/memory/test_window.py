"""HistoryMemory: per-env reset/store/fetch, windows, budgets, bounded storage, state round trip."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from agent_memory import HistoryMemory
from agent_memory.memory import normalize_env_ids


def _store_steps(mem: HistoryMemory, steps: int, env_ids=None, tag: str = "o") -> None:
    ids = list(range(mem.num_envs)) if env_ids is None else list(env_ids)
    for _ in range(steps):
        t = [mem.num_steps(i) + 1 for i in ids]
        mem.store(
            {
                "observation": [f"{tag}{i}.{s}" for i, s in zip(ids, t, strict=True)],
                "action": ["a"] * len(ids),
            },
            env_ids=ids,
        )


def test_window_uses_absolute_step_numbers():
    mem = HistoryMemory(1)
    _store_steps(mem, 25)
    contexts, lengths = mem.fetch(5)
    assert lengths == [5]
    numbers = [int(n) for n in re.findall(r"Observation (\d+):", contexts[0])]
    assert numbers == [21, 22, 23, 24, 25]


@pytest.mark.parametrize(("history_length", "expected"), [(0, 0), (-1, 7), (3, 3), (100, 7)])
def test_history_length_semantics(history_length, expected):
    mem = HistoryMemory(2)
    _store_steps(mem, 7)
    contexts, lengths = mem.fetch(history_length)
    assert lengths == [expected, expected]
    assert contexts[0].count("[Observation") == expected
    if expected == 0:
        assert contexts == ["", ""]


def test_per_env_store_and_reset_are_independent():
    mem = HistoryMemory(3)
    _store_steps(mem, 2)
    _store_steps(mem, 3, env_ids=[1])
    mem.reset(env_ids=[0])
    assert mem.step_counts == [0, 5, 2]
    assert mem[0] == []
    assert [r["observation"] for r in mem[1]] == ["o1.1", "o1.2", "o1.3", "o1.4", "o1.5"]
    _store_steps(mem, 1, env_ids=[0], tag="new")
    assert mem[0] == [{"observation": "new0.1", "action": "a"}]
    assert mem.fetch(10, env_ids=[0, 2]).lengths == [1, 2]


def test_store_values_follow_env_ids_order():
    mem = HistoryMemory(3)
    mem.store({"observation": ["for 2", "for 0"], "action": ["x", "y"]}, env_ids=[2, 0])
    assert mem[2] == [{"observation": "for 2", "action": "x"}]
    assert mem[0] == [{"observation": "for 0", "action": "y"}]
    assert mem[1] == []


def test_numpy_env_ids_and_values():
    mem = HistoryMemory(4)
    mem.store({"observation": np.array(["a", "b"]), "action": ("l", "r")}, env_ids=np.array([3, 1]))
    assert mem.step_counts == [0, 1, 0, 1]
    assert mem.fetch(1, env_ids=[3]).contexts == ["[Observation 1: 'a', Action 1: 'l']"]


def test_flexible_schema_is_fixed_per_episode():
    mem = HistoryMemory(2, "jinja")
    rec = {
        "observation": ["o", "p"],
        "action": ["a", "b"],
        "thought": ["t", "u"],
        "image": ["i1", "i2"],
    }
    mem.store(rec)
    # Same keys in another order are the same schema.
    mem.store({k: rec[k] for k in reversed(list(rec))})
    assert list(mem[0][1]) == ["observation", "action", "thought", "image"]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "record keys differ from env 0's episode keys ['action', 'image', 'observation', "
            "'thought']: missing ['image', 'thought'], unexpected ['metadata']"
        ),
    ):
        mem.store({"observation": ["o", "p"], "action": ["a", "b"], "metadata": [1, 2]})
    assert mem.step_counts == [2, 2]  # nothing stored by the failed call
    mem.reset(env_ids=[1])  # a new episode may use a new schema
    mem.store({"observation": ["x"], "action": ["y"], "metadata": [{"k": 1}]}, env_ids=[1])
    assert mem[1] == [{"observation": "x", "action": "y", "metadata": {"k": 1}}]


@pytest.mark.parametrize(
    ("record", "env_ids", "error", "message"),
    [
        (
            {"observation": ["a"], "action": ["b"]},
            None,
            ValueError,
            "record['observation'] has 1 values, expected 2 (one per env in env_ids)",
        ),
        (
            {"observation": "ab", "action": ["b", "c"]},
            None,
            TypeError,
            "record['observation'] must be a sequence with one value per env, got str; "
            "wrap a single env's value in a list",
        ),
        ({}, None, TypeError, "record must be a non-empty mapping key -> one value per env"),
        ([("observation", ["a", "b"])], None, TypeError, "record must be a non-empty mapping"),
        (
            {"observation": ["a"], "action": ["b"]},
            [2],
            IndexError,
            "env_ids must be in [0, 2), got [2]",
        ),
        (
            {"observation": ["a", "b"], "action": ["b", "c"]},
            [1, 1],
            ValueError,
            "env_ids must not repeat, got [1] more than once",
        ),
        (
            {"observation": ["a"], "action": ["b"]},
            np.array([True, False]),
            TypeError,
            "env_ids must be integer indices, got a boolean mask; pass np.flatnonzero(mask)",
        ),
        (
            {"obs": ["a", "b"], "action": ["b", "c"]},
            None,
            ValueError,
            "the 'simple' formatter needs record keys ['action', 'observation'], got ['action', "
            "'obs']; missing ['observation'] (set the formatter's obs_key/action_key)",
        ),
    ],
)
def test_bad_store_input_is_refused_with_a_clear_error(record, env_ids, error, message):
    mem = HistoryMemory(2)
    with pytest.raises(error, match=re.escape(message)):
        mem.store(record, env_ids=env_ids)
    assert mem.step_counts == [0, 0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 0}, "num_envs must be an int >= 1, got 0"),
        ({"num_envs": 2, "capacity": 0}, "capacity must be None or an int >= 1, got 0"),
        (
            {"num_envs": 2, "max_history_tokens": -5},
            "max_history_tokens must be None or an int >= 0, got -5",
        ),
        ({"num_envs": 2, "formatter": "smple"}, "unknown formatter 'smple': expected one of"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HistoryMemory(**kwargs)


def test_bad_fetch_arguments():
    mem = HistoryMemory(2, capacity=3)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "history_length must be -1 (whole episode), 0 (none) or k > 0 (last k steps), got -3"
        ),
    ):
        mem.fetch(-3)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "history_length=5 needs more steps than this memory keeps (capacity=3): expected history_length in [0, 3]"
        ),
    ):
        mem.fetch(5)
    with pytest.raises(ValueError, match=re.escape("history_length=-1 needs more steps")):
        mem.fetch(-1)
    with pytest.raises(
        ValueError, match=re.escape("max_history_tokens has 1 budgets, expected 2 (one per env)")
    ):
        mem.fetch(2, max_history_tokens=[10])
    with pytest.raises(TypeError, match=re.escape("env index must be an int, got str")):
        mem["0"]
    with pytest.raises(IndexError, match=re.escape("env index must be in [-2, 2), got 2")):
        mem.num_steps(2)


def test_token_budget_keeps_newest_whole_steps():
    mem = HistoryMemory(1, token_counter="chars")
    # Rendered steps of different lengths; the chars counter counts each with its "\n".
    for obs in ["x" * 10, "y" * 30, "z" * 5, "w" * 12]:
        mem.store({"observation": [obs], "action": ["go"]})
    sizes = mem.step_tokens(0)
    assert sizes == [len(f"[Observation 1: '{'x' * 10}', Action 1: 'go']") + 1, *sizes[1:]]
    budget = sizes[-1] + sizes[-2]
    contexts, lengths = mem.fetch(-1, max_history_tokens=budget)
    assert lengths == [2]
    assert contexts[0].startswith("[Observation 3: 'zzzzz'")
    assert len(contexts[0]) <= budget
    assert mem.fetch(-1, max_history_tokens=budget - 1).lengths == [1]  # never splits a step
    assert mem.fetch(-1, max_history_tokens=sizes[-1] - 1).lengths == [0]
    assert mem.fetch(1, max_history_tokens=10**6).lengths == [1]  # the window still applies
    assert mem.fetch(-1, max_history_tokens=[None]).lengths == [4]


def test_default_budget_and_per_env_budgets():
    mem = HistoryMemory(2, max_history_tokens=0)
    _store_steps(mem, 3)
    assert mem.fetch(-1).lengths == [0, 0]
    assert mem.fetch(-1, max_history_tokens=None).lengths == [3, 3]
    big = sum(mem.step_tokens(1))
    assert mem.fetch(-1, max_history_tokens=[0, big]).lengths == [0, 3]


def test_per_step_counts_are_made_once_at_store_time():
    calls: list[str] = []

    def counter(text: str) -> int:
        calls.append(text)
        return len(text.split())

    mem = HistoryMemory(2, token_counter=counter, max_history_tokens=50)
    _store_steps(mem, 4)
    assert len(calls) == 8
    for _ in range(10):
        mem.fetch(3)
    assert len(calls) == 8


def test_bounded_storage_keeps_only_the_window_with_absolute_numbers():
    mem = HistoryMemory(2, capacity=3)
    _store_steps(mem, 100)
    assert mem.step_counts == [100, 100]
    assert [r["observation"] for r in mem[0]] == ["o0.98", "o0.99", "o0.100"]
    assert len(mem._rows[0]) <= 2 * 3  # O(window) storage
    contexts, lengths = mem.fetch(3)
    assert lengths == [3, 3]
    assert contexts[1].splitlines()[0] == "[Observation 98: 'o1.98', Action 98: 'a']"
    unbounded = HistoryMemory(2)
    _store_steps(unbounded, 100)
    assert unbounded.fetch(3) == mem.fetch(3)
    assert unbounded.fetch(2, max_history_tokens=40) == mem.fetch(2, max_history_tokens=40)


@pytest.mark.parametrize("formatter", ["simple", "search", "code", "chat", "jinja"])
@pytest.mark.parametrize("capacity", [None, 4])
def test_state_round_trip_mid_episode(formatter, capacity):
    mem = HistoryMemory(3, formatter, capacity=capacity, max_history_tokens=60)
    _store_steps(mem, 6)
    _store_steps(mem, 2, env_ids=[2])
    mem.reset(env_ids=[1])
    state = json.loads(json.dumps(mem.state_dict()))  # JSON-able
    clone = HistoryMemory(3, formatter, capacity=capacity, max_history_tokens=60)
    clone.load_state_dict(state)
    for hl in (0, 1, 3, 4):
        assert clone.fetch(hl) == mem.fetch(hl)
        assert clone.fetch(hl, max_history_tokens=None) == mem.fetch(hl, max_history_tokens=None)
    assert [clone[i] for i in range(3)] == [mem[i] for i in range(3)]
    assert clone.step_counts == mem.step_counts
    # Both continue identically after the round trip.
    _store_steps(mem, 2)
    _store_steps(clone, 2)
    assert clone.fetch(4) == mem.fetch(4)


def test_load_state_rerenders_for_another_formatter():
    mem = HistoryMemory(1, "simple")
    _store_steps(mem, 3)
    other = HistoryMemory(1, "search")
    other.load_state_dict(mem.state_dict())
    fresh = HistoryMemory(1, "search")
    _store_steps(fresh, 3)
    assert other.fetch(-1) == fresh.fetch(-1)


def test_load_state_refuses_a_mismatched_state():
    state = HistoryMemory(2).state_dict()
    with pytest.raises(
        ValueError, match=re.escape("cannot load state: expected num_envs=3, got 2")
    ):
        HistoryMemory(3).load_state_dict(state)
    with pytest.raises(
        ValueError, match=re.escape("cannot load state: expected version=1, got 99")
    ):
        HistoryMemory(2).load_state_dict({**state, "version": 99})


def test_set_formatter_rerenders_stored_steps():
    mem = HistoryMemory(1)
    _store_steps(mem, 2)
    mem.set_formatter({"name": "code", "max_chars": None})
    assert (
        mem.fetch(-1).contexts[0]
        == "\nCode 1: \na\n\nResult 1: \no0.1\n\nCode 2: \na\n\nResult 2: \no0.2\n"
    )


def test_normalize_env_ids_errors():
    with pytest.raises(TypeError, match=re.escape("env_ids must hold ints, got 1.0 (float)")):
        normalize_env_ids([1.0], 3)
    with pytest.raises(
        TypeError, match=re.escape("env_ids must be a sequence of ints or None, got int")
    ):
        normalize_env_ids(3, 3)


def test_read_api_counts_held_steps_with_absolute_numbers_under_bounded_storage():
    mem = HistoryMemory(2, token_counter="chars", capacity=3)
    for t in range(1, 9):  # env 0: 8 steps, 3 held (trimming is lazy inside)
        mem.store({"observation": [f"o{t}"], "action": ["a"]}, env_ids=[0])
    mem.store({"observation": ["x"], "action": ["b"]}, env_ids=[1])
    assert [mem.held(0), mem.first_step(0), mem.num_steps(0)] == [3, 6, 8]
    assert [mem.held(1), mem.first_step(1)] == [1, 1]
    shown = mem.renderings(0)
    assert shown == [f"[Observation {t}: 'o{t}', Action {t}: 'a']" for t in (6, 7, 8)]
    assert mem.renderings(0, 1, 2) == shown[1:2]
    costs = [len(r) + 1 for r in shown]  # chars counter; each step with its separator
    assert mem.step_tokens(0) == costs and mem.tokens(0) == sum(costs)
    assert mem.tokens(0, 1) == sum(costs[1:]) and mem.tokens(0, 0, 1) == costs[0]
    assert [mem.window_steps(0, hl) for hl in (0, 1, 3)] == [0, 1, 3]
    assert mem.window_steps(0, 3, costs[-1] + costs[-2]) == 2
    assert mem.fetch(3, max_history_tokens=costs[-1] + costs[-2]).lengths[0] == 2
    with pytest.raises(ValueError, match=re.escape("history_length=-1 needs more steps")):
        mem.window_steps(0, -1)
    mem.keep_newest(0, 1)
    assert [mem.held(0), mem.first_step(0), mem.num_steps(0)] == [1, 8, 8]
    assert mem[0] == [{"observation": "o8", "action": "a"}]
    mem.store({"observation": ["o9"], "action": ["a"]}, env_ids=[0])
    assert mem.renderings(0)[-1].startswith("[Observation 9:")
    empty = HistoryMemory(1)
    assert [empty.held(0), empty.first_step(0), empty.tokens(0), empty.window_steps(0, 2)] == [
        0,
        1,
        0,
        0,
    ]
