"""agent_memory.compat.verl is a drop-in for verl-agent's SimpleMemory/SearchMemory."""

from __future__ import annotations

import random
import re

import pytest
from bench_lib.verl_reference import ReferenceSearchMemory, ReferenceSimpleMemory

from agent_memory.compat.verl import SearchMemory, SimpleMemory


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice("ab '\n√{}") for _ in range(rng.randint(0, 8)))


@pytest.mark.parametrize(
    ("ours", "theirs", "keys"),
    [
        (SimpleMemory, ReferenceSimpleMemory, ("text_obs", "action")),
        (SimpleMemory, ReferenceSimpleMemory, ("anchor", "act")),
        (SearchMemory, ReferenceSearchMemory, ("information", "search")),
    ],
)
def test_byte_identical_to_verl_agent(ours, theirs, keys):
    rng = random.Random(0)
    a, b = ours(), theirs()
    obs_key, action_key = keys
    for _episode in range(3):
        batch = rng.randint(1, 5)
        a.reset(batch_size=batch)
        b.reset(batch_size=batch)
        for _ in range(rng.randint(1, 25)):
            record = {
                obs_key: [_random_text(rng) for _ in range(batch)],
                action_key: [_random_text(rng) for _ in range(batch)],
            }
            a.store(record)
            b.store(record)
            for history_length in (0, 1, 3, 10, 50):
                assert a.fetch(history_length, obs_key=obs_key, action_key=action_key) == b.fetch(
                    history_length, obs_key=obs_key, action_key=action_key
                )
            assert len(a) == len(b) == batch
            assert [a[i] for i in range(batch)] == [b[i] for i in range(batch)]


def test_extra_record_keys_are_kept_like_verl():
    mem = SimpleMemory()
    mem.reset(2)
    mem.store({"text_obs": ["o1", "o2"], "action": ["a1", "a2"], "anchor": ["x", "y"]})
    assert mem[1] == [{"text_obs": "o2", "action": "a2", "anchor": "y"}]
    assert mem.fetch(2)[0] == [
        "[Observation 1: 'o1', Action 1: 'a1']",
        "[Observation 1: 'o2', Action 1: 'a2']",
    ]


def test_misuse_gives_clear_errors():
    mem = SimpleMemory()
    with pytest.raises(
        RuntimeError, match=re.escape("call reset(batch_size) before store(record)")
    ):
        mem.store({"text_obs": ["o"], "action": ["a"]})
    mem.reset(1)
    mem.store({"text_obs": ["o"], "action": ["a"]})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "record keys ['text_obs'] differ from the batch's ['text_obs', 'action']: missing ['action'], unexpected []"
        ),
    ):
        mem.store({"text_obs": ["o"]})
    with pytest.raises(
        ValueError,
        match=re.escape("history_length must be >= 0 (0 = every step, as in verl-agent), got -1"),
    ):
        mem.fetch(-1)
