"""Tests for TextAdapter (your own Discrete env as a text env) and the tabular oracle."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from agent_memory.envs.text_adapter import (
    TabularOracle,
    TextAdapter,
    greedy_policy,
    normalize_action,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")


def test_normalize_action() -> None:
    assert normalize_action("  Pick \n UP ") == "pick up"
    assert normalize_action("left") == "left"


def test_greedy_policy_and_tabular_oracle() -> None:
    # Two ways to the goal from state 0: a sure 3-step road, or a 1-step gamble (50% death).
    P = {
        0: {0: [(1.0, 1, 0.0, False)], 1: [(0.5, 3, 1.0, True), (0.5, 4, 0.0, True)]},
        1: {0: [(1.0, 2, 0.0, False)], 1: [(1.0, 0, 0.0, False)]},
        2: {0: [(1.0, 3, 1.0, True)], 1: [(1.0, 1, 0.0, False)]},
        3: {0: [(1.0, 3, 0.0, True)], 1: [(1.0, 3, 0.0, True)]},
        4: {0: [(1.0, 4, 0.0, True)], 1: [(1.0, 4, 0.0, True)]},
    }
    assert greedy_policy(P).tolist()[:3] == [0, 0, 0]  # 0.99**2 > 0.5: the sure road
    assert greedy_policy(P, gamma=0.5).tolist()[0] == 1  # 0.25 < 0.5: gamble
    assert greedy_policy(P, reward_fn=lambda s, a, s2, r, d: float(s2 == 4)).tolist()[0] == 1
    with pytest.raises(ValueError, match=re.escape("gamma must be in (0, 1], got 0")):
        greedy_policy(P, gamma=0)


# --- your own env in a few lines ---------------------------------------------------------------


class Ladder(gym.Env):
    """A tiny user env: climb from rung 0 to rung 4; rung 2 is broken (falls to 0).

    Actions are ``Discrete(3, start=-1)``: -1 down, 0 wait, +1 up. It keeps a Gymnasium-style
    table ``P`` so :class:`TabularOracle` can solve it.
    """

    observation_space = spaces.Discrete(5)
    action_space = spaces.Discrete(3, start=-1)

    def __init__(self, broken: int = 2) -> None:
        self.broken = broken
        self.P: dict[int, dict[int, list]] = {}
        for s in range(5):
            self.P[s] = {}
            for a in range(3):
                to = min(max(s + a - 1, 0), 4)
                if to == broken:
                    self.P[s][a] = [(1.0, 0, -1.0, False)]
                else:
                    self.P[s][a] = [(1.0, to, 1.0 if to == 4 else 0.0, to == 4)]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.s = 0
        return self.s, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        ((_, self.s, reward, done),) = self.P[self.s][int(action) + 1]
        return self.s, reward, done, False, {"rung": self.s}


def test_user_env_adapted_in_a_few_lines() -> None:
    env = TextAdapter(
        Ladder(broken=5),  # no broken rung: plain climb
        obs_to_text=lambda env, s: f"You are on rung {s} of 4.",
        action_names=["down", "wait", "up"],
        task="Climb to rung 4.",
        oracle_fn=lambda env, s: 1,  # an index in the env's own action space: +1 is "up"
    )
    check_env(env)
    obs, info = env.reset(seed=0)
    assert (obs, info["task"], info["admissible_actions"]) == (
        "You are on rung 0 of 4.",
        "Climb to rung 4.",
        ["down", "wait", "up"],
    )
    total, terminated = 0.0, False
    while not terminated:
        assert env.oracle_action() == "up"
        obs, reward, terminated, _, info = env.step(env.oracle_action())
        total += reward
    assert (obs, total, info["won"], info["rung"]) == ("You are on rung 4 of 4.", 1.0, True, 4)


def test_user_env_with_every_hook() -> None:
    def admissible(env: gym.Env, s: int) -> list[str]:
        return ["wait", "up"] if s == 0 else ["down", "wait", "up"]

    env = TextAdapter(
        Ladder(broken=2),
        obs_to_text=lambda env, s: f"rung {s}",
        action_names=["down", "wait", "up"],
        won_fn=lambda env, s, reward, terminated, info: s == 4,
        state_key_fn=lambda env, s: f"rung-{s}",
        oracle_fn=TabularOracle(),
        admissible_fn=admissible,
        invalid_action_reward=-0.5,
        render_mode="ansi",
    )
    check_env(env)
    _, info = env.reset(seed=0)
    assert (info["state_key"], info["admissible_actions"]) == ("rung-0", ["wait", "up"])
    _, reward, _, _, info = env.step("down")
    assert (reward, info["is_action_valid"]) == (-0.5, False)
    assert (
        info["invalid_reason"]
        == "action 'down' is not admissible now; admissible actions: wait, up"
    )
    # Rung 2 is broken: the oracle cannot get past it and never steps on it, so it waits or
    # goes back down, never up from rung 1.
    env.step("up")
    assert env.inner_obs == 1 and env.oracle_action() != "up"
    _, reward, _, _, info = env.step("up")
    assert (env.inner_obs, reward, info["state_key"]) == (0, -1.0, "rung-0")
    with pytest.raises(NotImplementedError, match="has no oracle"):
        TextAdapter(Ladder(), lambda e, s: "", ["a", "b", "c"]).oracle_action()


def test_oracle_fn_results_are_checked() -> None:
    env = TextAdapter(Ladder(), lambda e, s: "", ["a", "b", "c"], oracle_fn=lambda e, s: 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=re.escape("oracle_fn returned action 2, outside [-1, 1]")):
        env.oracle_action()
    env = TextAdapter(Ladder(), lambda e, s: "", ["a", "b", "c"], oracle_fn=lambda e, s: " B ")
    env.reset(seed=0)
    assert env.oracle_action() == "b"
    env = TextAdapter(Ladder(), lambda e, s: "", ["a", "b", "c"], oracle_fn=lambda e, s: "z")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=re.escape("oracle_fn returned 'z': unknown action 'z'")):
        env.oracle_action()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: TextAdapter("FrozenLake", lambda e, o: "", ["a"]),
            TypeError,
            "env must be a gymnasium.Env, got str",
        ),
        (
            lambda: TextAdapter(gym.make("MountainCarContinuous-v0"), lambda e, o: "", ["a"]),
            ValueError,
            "env.action_space must be gymnasium.spaces.Discrete, got Box(",
        ),
        (
            lambda: TextAdapter(Ladder(), lambda e, o: "", ["down", "up"]),
            ValueError,
            "action_names must name each of the 3 actions of Discrete(3, start=-1), "
            "got 2 names: ['down', 'up']",
        ),
        (
            lambda: TextAdapter(Ladder(), lambda e, o: "", "abc"),
            ValueError,
            "action_names must be a sequence of names, got the string 'abc'",
        ),
        (
            lambda: TextAdapter(Ladder(), lambda e, o: "", ["up", " ", "down"]),
            ValueError,
            "action_names must be non-empty strings, got [' ']",
        ),
        (
            lambda: TextAdapter(Ladder(), lambda e, o: "", ["Up", "wait", "up "]),
            ValueError,
            "action_names must differ after lower-casing and collapsing whitespace, "
            "got duplicates ['up'] in ['Up', 'wait', 'up ']",
        ),
        (
            lambda: TextAdapter(Ladder(), lambda e, o: "", ["a", "b", "c"], render_mode="human"),
            ValueError,
            "render_mode must be None or 'ansi', got 'human'",
        ),
    ],
)
def test_constructor_errors(make: Callable[[], Any], error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_a_gymnasium_discrete_env_adapts_as_is() -> None:
    env = TextAdapter(
        gym.make("CartPole-v1"),
        obs_to_text=lambda env, obs: f"pole angle {obs[2]:+.3f}",
        action_names=["push left", "push right"],
    )
    check_env(env)
    obs, info = env.reset(seed=0)
    assert obs.startswith("pole angle ") and info["won"] is False
    _, reward, _, _, info = env.step("PUSH  right")
    assert (reward, info["is_action_valid"]) == (1.0, True)


def test_the_adapter_draws_from_the_inner_envs_generator() -> None:
    # A reset seeds one generator, the inner env's (the adapter draws nothing itself): the
    # adapter's np_random is that one, as a Gymnasium wrapper's is, and a seed replays the
    # slippery lake's moves exactly.
    inner = gym.make("FrozenLake-v1", is_slippery=True)
    env = TextAdapter(
        inner, obs_to_text=lambda env, s: f"cell {s}", action_names=["l", "d", "r", "u"]
    )
    check_env(env)

    def walk() -> list[str]:
        obs, _ = env.reset(seed=7)
        seen = [obs]
        for k in range(12):
            obs, _, terminated, truncated, _ = env.step("ldru"[k % 4])
            seen.append(obs)
            if terminated or truncated:
                break
        return seen

    first = walk()
    assert env.np_random is inner.unwrapped.np_random and env.np_random_seed == 7
    assert walk() == first


class Notebook(gym.Env):
    """An env whose info holds a list (mutable): each call's info must be a fresh copy."""

    observation_space, action_space = spaces.Discrete(2), spaces.Discrete(1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.notes = ["start"]
        return 0, {"notes": self.notes, "prob": 1.0}

    def step(self, action: int):
        self.notes.append("step")
        return 1, 0.0, False, False, {"notes": self.notes, "prob": 1.0}


def test_infos_share_no_mutable_value_across_calls() -> None:
    env = TextAdapter(Notebook(), obs_to_text=lambda env, s: f"page {s}", action_names=["write"])
    _, info = env.reset(seed=0)
    info["notes"].append("mine")  # a caller's change reaches neither the env nor later infos
    _, _, _, _, info2 = env.step("write")
    assert info2["notes"] == ["start", "step"] and info2["notes"] is not env.unwrapped.env.notes
    assert info2["prob"] == 1.0
