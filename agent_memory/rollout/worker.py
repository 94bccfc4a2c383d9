"""``RolloutWorker``: one Ray actor owning one wrapped vector env that holds many sub-envs.

The driver (:mod:`agent_memory.rollout.collector`) decides which episode each sub-env plays and
when; the worker only executes: ``reset_envs`` starts episodes (each with its group's seed, via a
partial reset), ``step`` applies responses and reports what happened to every live env.

The vector env runs with ``autoreset_mode=DISABLED``: nothing restarts behind the driver's back,
so every episode starts from the seed it was given (group members share a start state) and a
finished env stays idle — no generation is spent on it. A sub-env with nothing to play is parked:
its wrapper answers resets and steps itself, without touching the env (a parked Code env spawns
no sandbox, a parked TextWorld env loads no game). Each sub-env is wrapped in
:class:`~agent_memory.wrappers.errors.CatchErrors`, so an exception ends only its own episode.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_memory.config import JobConfig
from agent_memory.memory import make_memory
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import VectorHistoryWrapper
from agent_memory.wrappers.errors import CatchErrors

__all__ = ["RolloutWorker", "build_env"]


class _Parkable(gym.Wrapper):
    """While ``parked``, reset and step return the last observation without calling the env."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.parked = False
        self._last_obs: Any = ""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.parked:
            return self._last_obs, {}
        obs, info = self.env.reset(**kwargs)
        self._last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self.parked:
            return self._last_obs, 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._last_obs = obs
        return obs, reward, terminated, truncated, info


def _make_sub_env(env_id: str, max_steps: int | None, kwargs: Mapping[str, Any]) -> gym.Env:
    import envs  # noqa: F401  (registers the bundled ids in this process)

    extra = {} if max_steps is None else {"max_episode_steps": max_steps}
    return _Parkable(CatchErrors(gym.make(env_id, **extra, **dict(kwargs))))


def build_env(job: JobConfig, num_envs: int) -> VectorHistoryWrapper:
    """The wrapped vector env a worker runs: ``num_envs`` sub-envs of ``job.env``, DISABLED
    autoreset, history per ``job.memory``."""
    fns = [
        partial(_make_sub_env, job.env.id, job.env.max_steps, dict(job.env.kwargs))
        for _ in range(num_envs)
    ]
    if job.rollout.vectorization == "async":
        venv = AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=AutoresetMode.DISABLED)
    else:
        venv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    mem = job.memory
    history_length = job.history_length
    counter = make_token_counter(mem.token_counter)
    memory = make_memory(
        mem.strategy, num_envs=num_envs, formatter=job.env.formatter, token_counter=counter,
        max_tokens=mem.max_tokens, capacity=job.memory_capacity, **dict(mem.params),
    )  # fmt: skip
    return VectorHistoryWrapper(
        venv, history_length=history_length, memory=memory, template=job.env.template.build(),
        parser=job.env.parser.build(), token_counter=counter,
        max_prompt_tokens=mem.max_prompt_tokens,
    )  # fmt: skip


def _at(info: Mapping[str, Any], key: str, i: int, default: Any = None) -> Any:
    value = info.get(key)
    if value is None:
        return default
    mask = info.get(f"_{key}")
    if mask is not None and not mask[i]:
        return default
    return value[i]


class RolloutWorker:
    """Runs the episodes the driver assigns on ``num_envs`` sub-envs (used as a Ray actor).

    Args:
        index: this worker's number (for reports).
        job: the validated job config.
        num_envs: sub-envs in this worker's vector env.
        meta_fields: per-env fields the policy needs besides the prompt
            (``admissible_actions``, ``oracle_action``, ``task``, ``raw_obs``).
    """

    def __init__(
        self, index: int, job: JobConfig, num_envs: int, meta_fields: list[str] | None = None
    ) -> None:
        self.index = index
        self.num_envs = num_envs
        self.meta_fields = set(meta_fields or [])
        self.env = build_env(job, num_envs)
        self.live = np.zeros(num_envs, dtype=bool)
        self.parked = np.ones(num_envs, dtype=bool)
        self.state_keys: list[str | None] = [None] * num_envs
        self.env.unwrapped.set_attr("parked", self.parked.tolist())
        self.env.reset()  # parked: no env work until an episode is assigned

    def pid(self) -> int:
        """The worker's process id (tests kill it to check recovery)."""
        return os.getpid()

    def reset_envs(
        self, assignments: Mapping[int, int | None], groups: Mapping[int, str] | None = None
    ) -> dict[int, dict[str, Any]]:
        """Start episodes: env index -> seed (``None`` parks the env), and optionally each
        episode's group (memories shared within a group read it). Returns each started env's
        first prompt and per-env figures."""
        if not assignments:
            return {}
        if groups:
            self.env.memory.set_groups(list(groups), list(groups.values()))
        mask = np.zeros(self.num_envs, dtype=bool)
        seeds: list[int | None] = [None] * self.num_envs
        for i, seed in assignments.items():
            mask[i] = True
            seeds[i] = seed
            self.parked[i] = seed is None
        self.env.unwrapped.set_attr("parked", self.parked.tolist())
        prompts, info = self.env.reset(seed=seeds, options={"reset_mask": mask})
        started = [i for i, seed in assignments.items() if seed is not None]
        views = self._views(started, prompts, info, acting=started)
        out = {}
        for i, seed in assignments.items():
            self.live[i] = seed is not None
            self.state_keys[i] = _at(info, "state_key", i)
            if seed is not None:
                view = views[i]
                error = _at(info, "error", i)
                if error is not None:  # the env failed to reset: the episode ends right away
                    view["error"] = error
                    self.live[i] = False
                out[i] = view
        return out

    def step(self, responses: Mapping[int, str]) -> dict[int, dict[str, Any]]:
        """Apply the responses of live envs (parked envs idle) and report, per live env, the
        step's outcome and the next prompt. A finished env must get ``reset_envs`` (a new episode
        or ``None`` to park it) before the next step."""
        unknown = [i for i in responses if not self.live[i]]
        if unknown:
            raise ValueError(f"worker {self.index}: env(s) {unknown} have no running episode")
        actions = [responses.get(i) for i in range(self.num_envs)]
        prompts, rewards, terminated, truncated, info = self.env.step(actions)
        done = np.logical_or(terminated, truncated)
        stepped = sorted(responses)
        # The oracle only for envs that act again: a finished env's next prompt is never answered.
        views = self._views(stepped, prompts, info, acting=[i for i in stepped if not done[i]])
        out: dict[int, dict[str, Any]] = {}
        for i in stepped:
            record = {
                "reward": float(rewards[i]),
                "terminated": bool(terminated[i]),
                "truncated": bool(truncated[i]),
                "valid": bool(_at(info, "is_action_valid", i, True)),
                "invalid_reason": _at(info, "invalid_reason", i),
                "parsed_action": _at(info, "parsed_action", i),
                "state_key": self.state_keys[i],
                "won": bool(_at(info, "won", i, False)),
                "error": _at(info, "error", i),
            }
            record["next"] = views[i]
            self.state_keys[i] = _at(info, "state_key", i)
            if done[i]:
                self.live[i] = False
            out[i] = record
        return out

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------------ internals

    def _views(
        self, ids: list[int], prompts: Any, info: Mapping[str, Any], acting: list[int]
    ) -> dict[int, dict[str, Any]]:
        """The prompts of ``ids`` with their figures and the policy's meta fields (the oracle's
        action for the envs in ``acting`` when the policy needs it, computed once per batch)."""
        core = self.env._core
        oracles = self._oracles(acting) if "oracle_action" in self.meta_fields else {}
        views = {}
        for i in ids:
            meta: dict[str, Any] = {}
            if "admissible_actions" in self.meta_fields:
                meta["admissible_actions"] = core.admissible[i]
            if "task" in self.meta_fields:
                meta["task"] = core.tasks[i]
            if "raw_obs" in self.meta_fields:
                meta["raw_obs"] = core.last_obs[i]
            if i in oracles:
                meta["oracle_action"] = oracles[i]
            views[i] = {
                "prompt": prompts[i],
                "context_tokens": int(info["context_tokens"][i]),
                "context_chars": int(info["context_chars"][i]),
                "history_steps": int(info["history_steps"][i]),
                "meta": meta,
            }
        return views

    def _oracles(self, ids: list[int]) -> dict[int, Any]:
        if not ids:
            return {}
        inner = self.env.unwrapped
        if isinstance(inner, SyncVectorEnv):
            return {i: inner.envs[i].get_wrapper_attr("oracle_action")() for i in ids}
        every = inner.call("oracle_action")  # async: one call reaches every sub-env at once
        return {i: every[i] for i in ids}
