"""The ``BaseMemory`` contract, run on every built-in strategy, each built the one way the wrappers
build it (``make_memory`` with the shared arguments and the strategy's params).

``fetch(...).lengths[i]`` is how many of env i's most recent steps the context shows as its
window (never more than ``history_length`` or the steps held; 0 for ``history_length=0``), and
the context ends with exactly those steps; ``max_history_tokens`` bounds every context; contexts are
what ``output`` says; the state round-trips; the hooks take their documented arguments.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from agent_memory.memory import (
    BaseMemory,
    HistoryMemory,
    available_memories,
    make_memory,
    memory_factory,
)
from agent_memory.memory.registry import _REGISTRY
from agent_memory.memory.settings import Settings
from agent_memory.tokens import make_token_counter

NUM_ENVS = 3
TASK = "Find the key."
SHARED = ("num_envs", "formatter", "max_history_tokens", "token_counter", "capacity")


def _params(name: str, tmp: Path) -> dict[str, Any]:
    """The least each built-in strategy needs (files under ``tmp``), and settings that make its
    block show up in a short test (a retrieval for every fetch, a board shared by all envs)."""
    return {
        "window": {},
        "history": {},
        "none": {},
        "full": {},
        "compaction": {"trigger_steps": 4, "keep_last": 2, "summary_max_tokens": 16},
        "retrieval": {"top_k": 2, "similarity_threshold": -1},
        "episodic": {"path": tmp / "episodic.sqlite", "retention": "persistent"},
        "blackboard": {"path": tmp / "board.sqlite", "scope": "global"},
        "conversation": {},
        "notes": {},
    }[name]


#: The built-in strategies (a name another test module registers is not one of them).
BUILTIN = sorted(_REGISTRY._builtins)
#: Names of the window strategy (HistoryMemory).
WINDOW_ALIASES = ("window", "history", "none", "full")
FORMATTERS = [
    (name, fmt)
    for name in BUILTIN
    for fmt in (("chat",) if name == "conversation" else ("simple", "chat"))
]


def build(name: str, tmp: Path, formatter: str = "simple", **shared: Any) -> BaseMemory:
    args = {
        "formatter": formatter,
        "token_counter": "estimate",
        "max_history_tokens": None,
        "capacity": None,
        **shared,
    }
    return make_memory(name, num_envs=NUM_ENVS, **args, **_params(name, tmp))


def episode(mem: BaseMemory, i: int) -> dict[str, Any]:
    return {
        "records": mem[i],
        "final_observation": "the door opens",
        "num_steps": mem.num_steps(i),
        "terminated": True,
        "truncated": False,
        "task": TASK,
        "return": 1.0,
        "won": True,
    }


def play(mem: BaseMemory) -> list[int]:
    """A finished first episode in every env, then a second one of 7, 2 and 0 steps; returns
    the second episode's step counts. Uses only the contract and its hooks."""
    ids = list(range(NUM_ENVS))
    mem.set_groups(ids, ["group-a"] * NUM_ENVS)
    mem.start_episodes(ids, [TASK] * NUM_ENVS, ["a hall"] * NUM_ENVS)
    for t in range(1, 4):
        mem.store({"observation": [f"env {i}: hall {t}" for i in ids], "action": ["north"] * 3})
    mem.end_episodes(ids, [episode(mem, i) for i in ids])
    mem.reset()
    mem.start_episodes(ids, [TASK] * NUM_ENVS, ["a hall"] * NUM_ENVS)
    steps = [7, 2, 0]
    for t in range(1, max(steps) + 1):
        live = [i for i in ids if steps[i] >= t]
        mem.store(
            {
                "observation": [f"env {i}: room {t} has a red door" for i in live],
                "action": [f"open door {t}" for _ in live],
            },
            env_ids=live,
        )
    return steps


def window_of(mem: BaseMemory, formatter: str, i: int, n: int) -> Any:
    """What a window of env ``i``'s ``n`` most recent steps looks like: a plain window memory fed
    the same records (after stand-ins for steps no longer held, so step numbers match)."""
    ref = HistoryMemory(1, formatter)
    held = mem[i]
    for _ in range(mem.num_steps(i) - len(held)):
        ref.store({"observation": ["-"], "action": ["-"]})
    for r in held:
        ref.store({key: [v] for key, v in r.items()})
    return ref.fetch(n).contexts[0]


def tokens(ctx: Any) -> int:
    """The estimate counter's count of a context (chat: the contents, one line each)."""
    text = ctx if isinstance(ctx, str) else "".join(m["content"] + "\n" for m in ctx)
    return make_token_counter("estimate")(text)


def test_every_builtin_strategy_is_tested():
    assert set(BUILTIN) <= set(available_memories())
    assert {
        "window",
        "history",
        "none",
        "full",
        "compaction",
        "retrieval",
        "episodic",
        "blackboard",
        "conversation",
        "notes",
    } == set(BUILTIN)


@pytest.mark.parametrize(("name", "formatter"), FORMATTERS)
@pytest.mark.parametrize("history_length", [-1, 0, 1, 3, 50])
def test_lengths_count_the_most_recent_steps_the_context_shows(
    tmp_path, name, formatter, history_length
):
    mem = build(name, tmp_path, formatter)
    play(mem)
    fetched = mem.fetch(history_length)
    assert len(fetched.contexts) == len(fetched.lengths) == NUM_ENVS
    for i in range(NUM_ENVS):
        held = len(mem[i])
        want = held if history_length == -1 else min(history_length, held)
        assert fetched.lengths[i] == want, (name, i, fetched.lengths)
        ctx, n = fetched.contexts[i], fetched.lengths[i]
        if n:  # the context ends with exactly the n most recent steps
            window = window_of(mem, formatter, i, n)
            if isinstance(ctx, str):
                assert ctx.endswith(window), (name, i, ctx)
            else:
                assert [m["content"] for m in ctx[-len(window) :]] == [
                    m["content"] for m in window
                ], (name, i, ctx)
    mem.close()


@pytest.mark.parametrize(("name", "formatter"), FORMATTERS)
def test_max_history_tokens_bounds_every_context(tmp_path, name, formatter):
    mem = build(name, tmp_path, formatter)
    play(mem)
    full = mem.fetch(-1, max_history_tokens=None)
    longest = max(tokens(c) for c in full.contexts)
    for budget in range(0, longest + 3):
        for hl in (-1, 3):
            fetched = mem.fetch(hl, max_history_tokens=budget)
            for i, ctx in enumerate(fetched.contexts):
                assert tokens(ctx) <= budget, (name, budget, hl, ctx)
                assert fetched.lengths[i] <= len(mem[i])
    per_env = mem.fetch(-1, max_history_tokens=[10, None, 0])
    assert tokens(per_env.contexts[0]) <= 10 and per_env.contexts[1] == full.contexts[1]
    assert tokens(per_env.contexts[2]) == 0
    mem.close()
    default = build(name, tmp_path / "default", formatter, max_history_tokens=30)
    play(default)
    assert default.max_history_tokens == 30
    assert all(tokens(c) <= 30 for c in default.fetch(-1).contexts)
    default.close()


@pytest.mark.parametrize(("name", "formatter"), FORMATTERS)
def test_contexts_are_what_output_says(tmp_path, name, formatter):
    mem = build(name, tmp_path, formatter)
    assert mem.output == ("messages" if formatter == "chat" else "text")
    empty = mem.fetch(3)
    if not type(mem).fetch_when_empty:  # nothing to show before a step is stored
        assert empty.contexts == [[] if mem.output == "messages" else ""] * NUM_ENVS
    assert empty.lengths == [0] * NUM_ENVS
    play(mem)
    for hl in (-1, 0, 2):
        for ctx in mem.fetch(hl).contexts:
            if mem.output == "text":
                assert isinstance(ctx, str)
            else:
                assert isinstance(ctx, list)
                assert all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in ctx)
    assert mem.fetch(0).lengths == [0] * NUM_ENVS
    if type(mem).accepts_queries:
        queries = ["which door is red?", None, "a hall"]
        assert mem.fetch(2, queries=queries).lengths == mem.fetch(2).lengths
    mem.close()


@pytest.mark.parametrize("name", BUILTIN)
def test_reset_store_getitem_num_steps_and_state_round_trip(tmp_path, name):
    formatter = "chat" if name == "conversation" else "simple"
    mem = build(name, tmp_path, formatter)
    steps = play(mem)
    assert [mem.num_steps(i) for i in range(NUM_ENVS)] == steps and len(mem) == NUM_ENVS
    assert [r["action"] for r in mem[1]] == ["open door 1", "open door 2"]
    assert mem[-1] == mem[NUM_ENVS - 1] == []
    state = json.loads(json.dumps(mem.state_dict()))  # JSON-able
    clone = build(name, tmp_path, formatter)
    clone.load_state_dict(state)
    for i in range(NUM_ENVS):
        assert clone[i] == mem[i] and clone.num_steps(i) == mem.num_steps(i)
    assert clone.fetch(-1) == mem.fetch(-1) and clone.fetch(2) == mem.fetch(2)
    mem.reset([0])
    assert mem.num_steps(0) == 0 and mem[0] == [] and mem.num_steps(1) == 2
    assert mem.fetch(-1).lengths[0] == 0
    mem.store({"observation": ["again"], "action": ["wait"]}, env_ids=[0])
    assert mem.num_steps(0) == 1 and mem[0] == [{"observation": "again", "action": "wait"}]
    other = HistoryMemory(NUM_ENVS) if name not in WINDOW_ALIASES else None
    if other is not None:  # a state of another kind is refused, with the kind named
        with pytest.raises(ValueError, match="cannot load state: expected kind="):
            clone.load_state_dict(other.state_dict())
    mem.close()
    clone.close()


@pytest.mark.parametrize("name", BUILTIN)
def test_hooks_take_their_documented_arguments(tmp_path, name):
    mem = build(name, tmp_path, "chat" if name == "conversation" else "simple")
    ids = [0, 2]
    mem.set_groups(ids, ["g1", "g2"])
    mem.start_episodes(ids, [TASK, None], ["a hall", "a cave"])
    mem.store({"observation": ["a hall", "a cave"], "action": ["north", "south"]}, env_ids=ids)
    assert mem.intercept(0, "<action>north</action>") is None  # an env action, not memory's
    reply = mem.intercept(2, "<record>the cave is dark</record>")
    assert reply is None or isinstance(reply, str)
    mem.end_episodes(ids, [episode(mem, i) for i in ids])
    mem.close()


@pytest.mark.parametrize("name", BUILTIN)
def test_settings_are_the_constructor_parameters(tmp_path, name):
    """A strategy with parameters of its own validates them in one frozen settings dataclass
    whose fields are exactly those parameters (plus shared ones its checks need), so configs
    bind ``memory.params`` to the constructor and the settings alike."""
    params = inspect.signature(memory_factory(name)).parameters.values()
    own = [p.name for p in params if p.name not in SHARED and p.kind is not p.VAR_KEYWORD]
    mem = build(name, tmp_path, "chat" if name == "conversation" else "simple")
    if any(p.kind is p.VAR_KEYWORD for p in params):  # ``**settings``: the dataclass's fields
        own += [f for f in type(mem.settings).field_names() if f not in SHARED]
    if own:
        assert isinstance(mem.settings, Settings)
        fields = type(mem.settings).field_names()
        assert set(own) <= set(fields) <= set(own) | set(SHARED), (name, fields)
        with pytest.raises(dataclasses.FrozenInstanceError):
            mem.settings.header = "changed"  # type: ignore[misc]
    mem.close()
