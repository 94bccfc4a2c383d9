"""step(actions, mask=...): only the masked envs act; held sub-envs are not touched at all.

A reference replays, from the env's rules alone, what each env must have stored, handed over and
counted, with random masks and finished envs left waiting (held) for a while before their reset.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_memory.parsing import ActionParser
from agent_memory.wrappers import Holdable, VectorHistoryWrapper, make_vec_holdable
from tests.wrappers.countdown import STAGGER, make


def _holdable(i: int, length: int, limit: int | None):
    inner = make(i, length, limit)
    return lambda: Holdable(inner())


def make_vec(kind: str, mode: AutoresetMode = AutoresetMode.DISABLED, holdable: bool = True):
    wrap = _holdable if holdable else make
    fns = [wrap(i, length, limit) for i, (length, limit) in enumerate(STAGGER)]
    if kind == "sync":
        return SyncVectorEnv(fns, autoreset_mode=mode)
    return AsyncVectorEnv(fns, autoreset_mode=mode, shared_memory=False)


class Reference:
    """Each env's episode number, step counter and records, from the env's rules alone."""

    def __init__(self) -> None:
        n = len(STAGGER)
        self.episode = [1] * n
        self.t = [0] * n
        self.records: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.finished = [False] * n

    def obs(self, i: int) -> str:
        return f"env{i} ep{self.episode[i]} t{self.t[i]}"

    def reset(self, i: int) -> None:
        self.episode[i] += 1
        self.t[i] = 0
        self.records[i] = []
        self.finished[i] = False

    def step(self, i: int, action: str) -> dict | None:
        self.records[i].append((self.obs(i), action))
        self.t[i] += 1
        length, limit = STAGGER[i]
        term = self.t[i] >= length
        trunc = not term and limit is not None and self.t[i] >= limit
        if not (term or trunc):
            return None
        self.finished[i] = True
        return {"records": list(self.records[i]), "final": self.obs(i), "done": (term, trunc)}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_masked_steps_match_the_reference_and_leave_held_envs_untouched(kind):
    env = VectorHistoryWrapper(make_vec(kind), history_length=-1)
    n = env.num_envs
    ref = Reference()
    rng = np.random.default_rng(0)
    prompts, _ = env.reset(seed=0)
    held_steps = waited = 0
    for g in range(40):
        # Some finished envs are reset now; the others stay held until a later round.
        again = np.array([ref.finished[i] and rng.random() < 0.4 for i in range(n)])
        if again.any():
            prompts, info = env.reset(options={"reset_mask": again})
            for i in np.flatnonzero(again):
                ref.reset(i)
            assert "_episode_history" not in info  # finished episodes were handed over already
        waited += sum(ref.finished)
        mask = np.array([not ref.finished[i] and rng.random() < 0.6 for i in range(n)])
        actions = [f"act{g}.{i}" if mask[i] else None for i in range(n)]
        expected = {i: ep for i in np.flatnonzero(mask) if (ep := ref.step(i, actions[i]))}
        before = prompts
        prompts, rewards, term, trunc, info = env.step(actions, mask=mask)
        held = np.flatnonzero(~mask).tolist()
        held_steps += len(held)
        for i in range(n):
            assert [(r["observation"], r["action"]) for r in env.memory[i]] == ref.records[i]
        for i in held:
            assert prompts[i] == before[i]
            assert (rewards[i], term[i], trunc[i]) == (0.0, False, False)
        for key in ("raw_obs", "history_steps", "context_tokens", "episode_step"):
            assert info[f"_{key}"].tolist() == mask.tolist(), key
        handed = info.get("_episode_history", np.zeros(n, dtype=bool))
        assert np.flatnonzero(handed).tolist() == sorted(expected)
        for i, ep in expected.items():
            got = info["episode_history"][i]
            assert [(r["observation"], r["action"]) for r in got["records"]] == ep["records"]
            assert got["final_observation"] == ep["final"]
            assert (got["terminated"], got["truncated"]) == ep["done"]
            assert (bool(term[i]), bool(trunc[i])) == ep["done"]
        # The sub-envs' own counters: a held env's step count and episode number did not move
        # (a held finished env is not even reset behind the scenes).
        assert list(env.unwrapped.get_attr("t")) == ref.t
        assert list(env.unwrapped.get_attr("episode")) == ref.episode
        for i in range(n):
            assert env.current(i).observation == ref.obs(i)
    assert held_steps > 30 and waited > 10  # the test held envs, finished ones included
    env.close()


def test_held_envs_get_no_verdict_and_no_penalty():
    env = VectorHistoryWrapper(
        make_vec("sync"), history_length=2, parser=ActionParser(invalid_penalty=-1.0)
    )
    env.reset(seed=0)
    mask = np.array([False, True, True, False])
    _, rewards, _, _, info = env.step(["junk", "<action>go</action>", "junk", "junk"], mask=mask)
    assert info["_is_action_valid"].tolist() == mask.tolist()
    assert info["is_action_valid"][[1, 2]].tolist() == [True, False]
    assert rewards.tolist() == [0.0, 1.0, 0.0, 0.0]  # env 2: its reward 1 and the penalty -1
    assert [env.memory.num_steps(i) for i in range(4)] == [0, 1, 1, 0]
    env.close()


def test_a_full_mask_is_a_plain_step_in_every_mode():
    plain = VectorHistoryWrapper(make_vec("sync", AutoresetMode.NEXT_STEP), history_length=2)
    masked = VectorHistoryWrapper(make_vec("sync", AutoresetMode.NEXT_STEP), history_length=2)
    assert plain.reset(seed=0)[0] == masked.reset(seed=0)[0]
    for g in range(6):
        actions = [f"a{g}"] * 4
        a = plain.step(actions)
        b = masked.step(actions, mask=np.ones(4, dtype=bool))
        assert a[0] == b[0] and (a[1] == b[1]).all()
        assert [plain.memory[i] for i in range(4)] == [masked.memory[i] for i in range(4)]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_partial_mask_is_refused_when_the_inner_env_autoresets(mode):
    env = VectorHistoryWrapper(make_vec("sync", mode))
    env.reset(seed=0)
    message = (
        f"step(mask=...) holds env(s) [1, 3] back, but the inner env's autoreset_mode is "
        f"{mode.name}: it steps (or autoresets) every sub-env on every step, so a held env's "
        "episode would move on unseen; build the vector env with "
        "autoreset_mode=AutoresetMode.DISABLED (e.g. "
        "agent_memory.wrappers.make_vec_holdable(env_id, n)) to step some envs only"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        env.step(["a"] * 4, mask=np.array([True, False, True, False]))
    with pytest.raises(
        ValueError,
        match=re.escape("mask must be a bool array of shape (4,), got dtype int64 shape (4,)"),
    ):
        env.step(["a"] * 4, mask=np.array([1, 0, 1, 0]))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sub_envs_that_cannot_be_held_are_named(kind):
    env = VectorHistoryWrapper(make_vec(kind, holdable=False))
    env.reset(seed=0)
    env.step(["a"] * 4, mask=np.ones(4, dtype=bool))  # nobody held: nothing to check
    with pytest.raises(
        ValueError,
        match=re.escape(
            "step(mask=...) holds sub-envs back, but sub-env(s) [0, 1, 2, 3] cannot be held (no "
            "Holdable wrapper): wrap each sub-env in agent_memory.wrappers.Holdable as its "
            "outermost wrapper"
        ),
    ):
        env.step(["a"] * 4, mask=np.array([False, True, True, True]))  # env 0 finished: held
    env.close()


def test_a_finished_env_in_the_mask_must_be_reset_first():
    env = VectorHistoryWrapper(make_vec("sync"))
    env.reset(seed=0)
    env.step(["a"] * 4)  # env 0 finishes (length 1)
    env.step([None, "b", "b", "b"], mask=np.array([False, True, True, True]))  # held: fine
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "env(s) [0] finished their episode and autoreset_mode is DISABLED: call "
            "reset(options={'reset_mask': mask}) for them before stepping (or leave them out "
            "of step's mask)"
        ),
    ):
        env.step(["c"] * 4, mask=np.array([True, False, False, True]))


def test_make_vec_holdable_builds_a_vector_env_the_mask_can_use():
    import agent_memory.envs  # noqa: F401  (registers the bundled envs)

    venv = make_vec_holdable(
        "agent_memory/Recall-v0", 2, wrappers=[lambda e: gym.wrappers.TimeLimit(e, 3)]
    )
    env = VectorHistoryWrapper(venv, history_length=2)
    prompts, _ = env.reset(seed=0)
    after, *_ = env.step(["next", None], mask=np.array([True, False]))
    assert after[1] == prompts[1] and after[0] != prompts[0]
    assert [env.memory.num_steps(i) for i in range(2)] == [1, 0]
    env.close()


def test_a_masked_reset_builds_and_releases_only_the_envs_it_resets():
    env = VectorHistoryWrapper(make_vec("sync"))
    env.reset(seed=0)
    env.step(["a"] * 4)  # env 0 finishes (length 1)
    env.step([None, "b", None, None], mask=np.array([False, True, False, False]))
    before = env.prompts
    built: list[list[int]] = []
    build = env._parts.builder.build
    env._parts.builder.build = lambda ids: built.append(list(ids)) or build(ids)
    subs = env.env.unwrapped.envs
    assert [s.hold for s in subs] == [True, False, True, True]
    prompts, _ = env.reset(options={"reset_mask": np.array([True, False, False, False])})
    assert built == [[0]]  # one prompt built, not every env's
    assert prompts[1:] == before[1:] and prompts[0] != before[0]
    assert [s.hold for s in subs] == [False, False, True, True]  # the others stay held
    after, *_ = env.step(["c", None, None, None], mask=np.array([True, False, False, False]))
    assert after[1:] == before[1:]
    assert [s.hold for s in subs] == [False, True, True, True]
