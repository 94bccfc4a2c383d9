"""A policy that plays the env's oracle is refused, before Ray starts, on a TextAdapter env built
without ``oracle_fn`` (the adapter's class has ``oracle_action()``; only the instance knows)."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import register

from agent_memory.config import ConfigError, EnvConfig, JobConfig, PolicyConfig
from agent_memory.envs.text_adapter import TextAdapter
from agent_memory.rollout.driver.oracle_check import check_policy_env


class Corridor(gym.Env):
    observation_space, action_space = spaces.Discrete(4), spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.pos = 0
        return self.pos, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        self.pos = min(max(self.pos + (1 if action == 1 else -1), 0), 3)
        return self.pos, float(self.pos == 3), self.pos == 3, False, {}


def make_corridor(oracle: bool = False) -> TextAdapter:
    return TextAdapter(
        Corridor(),
        obs_to_text=lambda env, pos: "".join("@" if i == pos else "." for i in range(4)),
        action_names=["left", "right"],
        task="Walk to the right end of the corridor.",
        oracle_fn=(lambda env, pos: "right") if oracle else None,
    )


for _id, _entry in (
    ("test_oracle/Corridor-v0", make_corridor),  # annotated: preflight knows the class it makes
    ("test_oracle/CorridorAnyClass-v0", lambda **kw: make_corridor(**kw)),  # class unknown
):
    if _id not in gym.registry:
        register(_id, entry_point=_entry, max_episode_steps=10)


def _job(env_id: str, policy: str, **kwargs: Any) -> JobConfig:
    return JobConfig(env=EnvConfig(id=env_id, kwargs=kwargs), policy=PolicyConfig(policy))


@pytest.mark.parametrize("env_id", ["test_oracle/Corridor-v0", "test_oracle/CorridorAnyClass-v0"])
@pytest.mark.parametrize("policy", ["scripted", "prompt_oracle"])
def test_an_oracle_policy_is_refused_on_a_text_adapter_without_oracle_fn(
    env_id: str, policy: str
) -> None:
    message = (
        f"policy={policy} plays the env's oracle, but env {env_id!r} "
        "(agent_memory.envs.text_adapter.TextAdapter) was built without oracle_fn, so it has no oracle and "
        "every episode would fail at its first step: pass policy=random (a policy that needs no "
        "oracle), or give the env an oracle: TextAdapter(..., oracle_fn=...) in its entry point"
    )
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        check_policy_env(_job(env_id, policy))
    assert err.value.key == "policy.name"


@pytest.mark.parametrize("env_id", ["test_oracle/Corridor-v0", "test_oracle/CorridorAnyClass-v0"])
def test_an_oracle_policy_passes_on_a_text_adapter_with_oracle_fn(env_id: str) -> None:
    check_policy_env(_job(env_id, "scripted", oracle=True))
    check_policy_env(_job(env_id, "random"))  # needs no oracle: the env is not even built


def test_bundled_envs_with_an_oracle_pass() -> None:
    check_policy_env(_job("agent_memory/FrozenLake-v0", "scripted"))  # a TextAdapter with one
    check_policy_env(_job("agent_memory/Sokoban-v0", "scripted"))  # a class with oracle_action()


def test_the_adapter_says_whether_it_has_an_oracle() -> None:
    assert make_corridor(oracle=True).has_oracle and not make_corridor().has_oracle


def test_a_factory_annotated_with_a_vague_type_is_an_unknown_class():
    # `-> Any` is a class on Python 3.11+ and `-> gym.Env` a base class: neither says whether
    # the env has an oracle, so preflight must not refuse the scripted policy for it.
    from agent_memory.rollout.driver.env_check import _made_class

    def anything() -> Any: ...

    def base() -> gym.Env: ...

    def concrete() -> TextAdapter: ...

    assert _made_class(anything) is None and _made_class(base) is None
    assert _made_class(concrete) is TextAdapter
