"""Model-based test: random interleavings of per-env reset/store/fetch/state round trips against a
naive reference that keeps whole episodes and re-renders everything on every fetch."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent_memory import HistoryMemory

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


def reference_line(fmt: str, step: int, obs: str, act: str) -> str:
    if fmt == "simple":
        return f"[Observation {step}: '{obs}', Action {step}: '{act}']"
    return f"Step {step}:{act} {obs}\n"


class Reference:
    """Whole episodes as lists; windows, budgets and numbering recomputed from scratch."""

    def __init__(self, num_envs: int, fmt: str) -> None:
        self.fmt = fmt
        self.episodes: list[list[tuple[str, str]]] = [[] for _ in range(num_envs)]

    def fetch(self, i: int, history_length: int, budget: int | None) -> tuple[str, int]:
        episode = self.episodes[i]
        lines = [reference_line(self.fmt, n + 1, o, a) for n, (o, a) in enumerate(episode)]
        window = lines if history_length == -1 else lines[max(0, len(lines) - history_length) :]
        if history_length == 0:
            window = []
        if budget is not None:
            kept: list[str] = []
            used = 0
            for line in reversed(window):  # chars counter: each step costs its text + "\n"
                if used + len(line) + 1 > budget:
                    break
                kept.insert(0, line)
                used += len(line) + 1
            window = kept
        return "\n".join(window), len(window)


class MemoryMachine(RuleBasedStateMachine):
    @initialize(
        num_envs=st.integers(1, 4),
        capacity=st.one_of(st.none(), st.integers(1, 5)),
        fmt=st.sampled_from(["simple", "search"]),
    )
    def setup(self, num_envs, capacity, fmt):
        self.num_envs = num_envs
        self.capacity = capacity
        self.fmt = fmt
        self.mem = HistoryMemory(num_envs, fmt, token_counter="chars", capacity=capacity)
        self.ref = Reference(num_envs, fmt)

    def _ids(self, data):
        return data.draw(st.lists(st.integers(0, self.num_envs - 1), unique=True))

    @rule(data=st.data())
    def store(self, data):
        ids = self._ids(data)
        obs = [data.draw(TEXT) for _ in ids]
        act = [data.draw(TEXT) for _ in ids]
        self.mem.store({"observation": obs, "action": act}, env_ids=ids)
        for i, o, a in zip(ids, obs, act, strict=True):
            self.ref.episodes[i].append((o, a))

    @rule(data=st.data(), everything=st.booleans())
    def reset(self, data, everything):
        ids = None if everything else self._ids(data)
        self.mem.reset(env_ids=ids)
        for i in range(self.num_envs) if ids is None else ids:
            self.ref.episodes[i] = []

    @rule(
        history_length=st.integers(-1, 6),
        budget=st.one_of(st.none(), st.integers(0, 200)),
        data=st.data(),
    )
    def fetch(self, history_length, budget, data):
        ids = self._ids(data)
        if self.capacity is not None and (history_length == -1 or history_length > self.capacity):
            with pytest.raises(ValueError, match="needs more steps than this memory keeps"):
                self.mem.fetch(history_length, env_ids=ids, max_history_tokens=budget)
            return
        contexts, lengths = self.mem.fetch(history_length, env_ids=ids, max_history_tokens=budget)
        expected = [self.ref.fetch(i, history_length, budget) for i in ids]
        assert contexts == [c for c, _ in expected]
        assert lengths == [n for _, n in expected]

    @precondition(lambda self: hasattr(self, "mem"))
    @rule()
    def round_trip(self):
        clone = HistoryMemory(
            self.num_envs, self.fmt, token_counter="chars", capacity=self.capacity
        )
        clone.load_state_dict(self.mem.state_dict())
        self.mem = clone

    @invariant()
    def records_and_counts_match(self):
        if not hasattr(self, "mem"):
            return
        for i, episode in enumerate(self.ref.episodes):
            assert self.mem.num_steps(i) == len(episode)
            held = episode if self.capacity is None else episode[-self.capacity :]
            assert [(r["observation"], r["action"]) for r in self.mem[i]] == held


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
