"""The masked step that calls only the acting sub-envs (SyncSubset) gives what the full step gives.

Two wrappers over identical vector envs get the same calls: one steps only the envs that act (a
``SyncVectorEnv`` with DISABLED autoreset and text spaces: the default), the other goes through
``SyncVectorEnv.step`` with the held envs parked (the path every other vector env takes). With
staggered episodes, random masks of 1 to all envs, finished envs held for a while, masked resets
with per-env seeds and invalid responses, every output must be equal: prompts, rewards, ends,
every info key with its ``_key`` mask (values and dtypes), the memory and the sub-envs' own state.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_memory.parsing import ActionParser
from agent_memory.wrappers import Holdable, VectorHistoryWrapper, make_vec_holdable
from agent_memory.wrappers.hold import SubEnvHolds
from agent_memory.wrappers.subset import SyncSubset
from tests.wrappers.countdown import STAGGER, make

RESPONSES = ("<action>{}</action>", "<think>hm</think><action>{}</action>", "no tags at all")


def _countdown() -> SyncVectorEnv:
    fns = [
        (lambda f: lambda: Holdable(f()))(make(i, length, limit))
        for i, (length, limit) in enumerate(STAGGER * 2)
    ]
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)


def _bundled(env_id: str) -> SyncVectorEnv:
    import agent_memory.envs  # noqa: F401  (registers the bundled envs)

    venv = make_vec_holdable(env_id, 6, wrappers=[lambda e: gym.wrappers.TimeLimit(e, 5)])
    assert isinstance(venv, SyncVectorEnv)
    return venv


MAKERS = {
    "countdown": (_countdown, ("go",)),
    "sokoban": (lambda: _bundled("agent_memory/Sokoban-v0"), ("up", "left", "down", "right")),
    "recall": (lambda: _bundled("agent_memory/Recall-v0"), ("next", "BROWN", "red")),
}


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tolist() == b.tolist(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), where
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{j}]")
    else:
        assert a == b, where


def _pair(kind: str) -> tuple[VectorHistoryWrapper, VectorHistoryWrapper]:
    make_venv, _ = MAKERS[kind]
    envs = []
    for _ in range(2):
        env = VectorHistoryWrapper(
            make_venv(), history_length=2, parser=ActionParser(invalid_penalty=-0.5)
        )
        envs.append(env)
    subset, full = envs
    assert subset._subset is not None
    full._subset = None  # the full step: SyncVectorEnv.step with the others held
    return subset, full


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_subset_step_gives_what_the_full_step_gives(kind):
    subset, full = _pair(kind)
    words = MAKERS[kind][1]
    n = subset.num_envs
    rng = np.random.default_rng(7)
    _same(subset.reset(seed=3), full.reset(seed=3), "reset")
    finished = np.zeros(n, dtype=bool)
    sizes = set()
    for g in range(60):
        again = finished & (rng.random(n) < 0.5)
        if again.any():
            # One seed per env, an int (env i gets seed + i) or none.
            seeds = ([int(s) for s in rng.integers(0, 1000, n)], int(rng.integers(1000)), None)[
                g % 3
            ]
            options = {"reset_mask": again}
            _same(
                subset.reset(seed=seeds, options=dict(options)),
                full.reset(seed=seeds, options=dict(options)),
                f"reset {g}",
            )
            finished &= ~again
        free = np.flatnonzero(~finished)
        if not free.size:
            continue
        take = rng.choice(free, size=int(rng.integers(1, free.size + 1)), replace=False)
        mask = np.zeros(n, dtype=bool)
        mask[take] = True
        sizes.add(int(mask.sum()))
        actions = [
            RESPONSES[rng.integers(3)].format(words[rng.integers(len(words))]) if mask[i] else None
            for i in range(n)
        ]
        extras = {"logprob": [float(g + i) for i in range(n)]}
        use_mask = None if mask.all() else mask
        a = subset.step(actions, extras, mask=use_mask)
        b = full.step(actions, extras, mask=use_mask)
        _same(a[0], b[0], f"prompts {g}")
        for j, name in enumerate(("rewards", "terminated", "truncated", "info"), start=1):
            _same(a[j], b[j], f"{name} {g}")
        finished |= a[2] | a[3]
        for i in range(n):
            assert subset.memory[i] == full.memory[i]
            assert subset.current(i) == full.current(i)
    assert 1 in sizes and len(sizes) > 3  # single envs and larger groups acted
    inner_a, inner_b = subset.env.unwrapped, full.env.unwrapped
    assert inner_a._autoreset_envs.tolist() == (finished).tolist()
    assert [s.hold for s in inner_a.envs] == [s.hold for s in inner_b.envs]
    subset.close()
    full.close()


def test_the_subset_step_is_only_for_envs_it_reproduces():
    holdable = [lambda: Holdable(make(0, 3)())]
    assert SyncSubset.fits(SyncVectorEnv(holdable, autoreset_mode=AutoresetMode.DISABLED))
    assert not SyncSubset.fits(SyncVectorEnv(holdable, autoreset_mode=AutoresetMode.NEXT_STEP))
    assert not SyncSubset.fits(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))
    venv = AsyncVectorEnv(holdable, autoreset_mode=AutoresetMode.DISABLED, shared_memory=False)
    assert not SyncSubset.fits(venv)
    venv.close()

    class Own(SyncVectorEnv):
        def step(self, actions):
            return super().step(actions)

    assert not SyncSubset.fits(Own(holdable, autoreset_mode=AutoresetMode.DISABLED))


def _spy(calls: list[tuple[str, int]], name: str, i: int, method: Any) -> Any:
    def spied(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, i))
        return method(*args, **kwargs)

    return spied


def test_held_envs_are_not_called_at_all():
    env = VectorHistoryWrapper(_countdown(), history_length=1)
    subs = env.env.unwrapped.envs
    n = len(subs)
    calls: list[tuple[str, int]] = []
    for i, sub in enumerate(subs):
        for name in ("step", "reset"):
            setattr(sub, name, _spy(calls, name, i, getattr(sub, name)))
    env.reset(seed=0)
    assert calls == [("reset", i) for i in range(n)]
    calls.clear()
    mask = np.zeros(n, dtype=bool)
    mask[[2, 5]] = True
    env.step(["go"] * n, mask=mask)
    assert calls == [("step", 2), ("step", 5)]
    calls.clear()
    first = np.eye(n, dtype=bool)[0]
    env.step(["go"] * n, mask=first)  # env 0 finishes (length 1)
    env.reset(seed=[7] * n, options={"reset_mask": first})
    assert calls == [("step", 0), ("reset", 0)]
    env.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_hold_all_but_sets_the_flags_set_would(kind):
    fns = [(lambda f: lambda: Holdable(f()))(make(i, 3)) for i in range(5)]
    venv = (
        SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
        if kind == "sync"
        else AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED, shared_memory=False)
    )
    holds = SubEnvHolds(venv)
    for ids in ([1, 3], [3], [0, 1, 2, 3, 4], [], [2]):
        holds.hold_all_but(ids)
        expected = [i not in ids for i in range(5)]
        assert holds.flags.tolist() == expected
        assert list(venv.get_attr("hold")) == expected
    holds.release(np.array([True, True, False, False, False]))
    holds.hold_all_but([4])
    assert list(venv.get_attr("hold")) == [True, True, True, True, False]
    venv.close()
