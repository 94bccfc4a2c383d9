"""env.current(i): what an env shows its policy, read through a frozen view (the env bank of a
rollout worker reads it too, and reports the task the prompt shows, not the env's generic one)."""

from __future__ import annotations

import dataclasses
import re

import gymnasium as gym
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.config import EnvConfig, JobConfig, TemplateConfig
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.wrappers import EnvView, HistoryWrapper, VectorHistoryWrapper

TASK = "Recall the colour you were shown first."


def test_current_reports_the_task_the_prompt_shows():
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
    env = VectorHistoryWrapper(venv, parser=ActionParser(), template=PromptTemplate(task=TASK))
    prompts, info = env.reset(seed=0)
    view = env.current(1)
    assert view.task == TASK != info["task"][1]  # the configured task wins over the env's
    assert TASK in prompts[1] and info["task"][1] not in prompts[1]
    assert view.observation == info["raw_obs"][1] and view.observation in prompts[1]
    assert view.admissible_actions == tuple(info["admissible_actions"][1])
    assert (view.episode_step, view.episode_return) == (0, 0.0)
    env.step(["<action>next</action>", "nonsense"])
    assert env.current(1).episode_step == 1 and view.episode_step == 0  # a copy, frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.task = "x"  # type: ignore[misc]
    with pytest.raises(IndexError, match=re.escape("env index must be an int in [0, 2), got 2")):
        env.current(2)
    # Without a configured task, the env's own.
    plain = VectorHistoryWrapper(
        gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync")
    )
    _, info = plain.reset(seed=0)
    assert plain.current(0).task == info["task"][0]
    single = HistoryWrapper(gym.make("agent_memory/Recall-v0"), template={"task": TASK})
    single.reset(seed=0)
    assert isinstance(single.current(), EnvView) and single.current().task == TASK


def test_the_env_bank_reports_the_configured_task():
    job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0", template=TemplateConfig(task=TASK)))
    bank = EnvBank(job, num_envs=2, meta_fields=["task", "raw_obs", "admissible_actions"])
    (result,) = bank.reset_envs([EpisodeAssignment(env=1, traj_uid="t", group_uid="g", seed=3)])
    meta = result.view.meta
    assert meta["task"] == TASK and TASK in result.view.prompt
    assert meta["raw_obs"] == result.view.observation and meta["raw_obs"] in result.view.prompt
    assert meta["admissible_actions"] == ["next"]
    (step,) = bank.step({1: "<action>next</action>"})
    assert step.is_action_valid and step.next.meta["task"] == TASK
    bank.close()
