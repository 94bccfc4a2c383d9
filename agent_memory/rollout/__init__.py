"""Rollouts: env banks, Ray workers, the driver, advantages (GRPO / GiGPO / PPO-GAE) and outputs.

``import agent_memory.rollout`` does not import Ray; starting a rollout does.
"""

from __future__ import annotations

from agent_memory.rollout.driver.advantages import (
    discounted_returns,
    gae,
    gigpo,
    group_normalize,
    grpo,
)
from agent_memory.rollout.driver.runner import run_rollout
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory

__all__ = [
    "EpisodeSpec",
    "StepRecord",
    "Trajectory",
    "discounted_returns",
    "gae",
    "gigpo",
    "group_normalize",
    "grpo",
    "run_rollout",
]
