"""verl-agent drop-in: an environment manager with ``EnvironmentManagerBase``'s interface, built
from this project's env, memory, prompt template and parser config.

It answers verl-agent's rollout loop (``reset(kwargs)``, then ``step(text_actions)`` every turn,
then ``success_evaluator(...)``) with a :class:`~agent_memory.wrappers.VectorHistoryWrapper`; a
finished env is held (never stepped or reset again) until the next ``reset``. A memory the policy
writes in turns of its own (``memory=compaction memory.params.summarizer=policy``) asks them as
observations: the next response answers the memory, not the env (reward 0, ``memory_turn`` in
the info). See ``docs/adapters.md`` for the observation and info layout and the invalid-action
penalty.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig
    >>> job = JobConfig(EnvConfig(id="agent_memory/Recall-v0", kwargs={"num_distractors": 1}))
    >>> envs = MemoryEnvironmentManager(job, env_num=1, group_n=2, seed=7)
    >>> obs, infos = envs.reset(kwargs=None)
    >>> len(obs["text"]), obs["image"], obs["anchor"][0] == obs["anchor"][1]
    (2, None, True)
    >>> obs, rewards, dones, infos = envs.step(["<action>next</action>", "no tag"])
    >>> rewards.tolist(), dones.tolist(), [i["is_action_valid"] for i in infos]
    ([0.0, 0.0], [False, False], [True, False])
    >>> "Action 1: 'next'" in obs["text"][0]
    True
    >>> envs.close()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any, TypedDict

import numpy as np

from agent_memory.config import ConfigError, JobConfig
from agent_memory.protocol import WON
from agent_memory.wrappers.vector_env import env_value

__all__ = ["MemoryEnvironmentManager", "Observations"]

#: Formatters whose prompts are chat message lists (verl-agent sends one text per env).
CHAT_FORMATTERS = ("chat", "transcript")
#: The keys of every info dict the manager returns, with their values before the first step.
_BLANK: dict[str, Any] = {
    WON: False,
    "is_action_valid": True,
    "invalid_reason": None,
    "parsed_action": None,
    "invalid_penalty": 0.0,
    "history_steps": 0,
    "episode_step": 0,
    "memory_turn": False,
    "active": True,
}
INFO_KEYS = tuple(_BLANK)
#: The keys of one row of ``env_kwargs``.
ROW_KEYS = ("seed",)


class Observations(TypedDict):
    """What ``reset`` and ``step`` return as observations (verl-agent's keys)."""

    text: list[str]
    image: None
    anchor: list[str]


class MemoryEnvironmentManager:
    """verl-agent's ``EnvironmentManagerBase`` interface over this project's wrapped vector env.

    Args:
        job: the env, memory, template and parser config (``job.policy`` is not used).
        env_num: groups (verl-agent's ``data.train_batch_size``).
        group_n: envs per group sharing a reset seed (verl-agent's ``env.rollout.n``).
        seed: resets without ``env_kwargs`` seed the groups ``seed, seed + 1, ...``, then on.

    Attributes:
        seeds: the reset seed of each env's current episode (empty before the first reset).

    Raises:
        ConfigError: a formatter that makes chat message lists (verl-agent wants text).
    """

    def __init__(self, job: JobConfig, env_num: int, group_n: int = 1, seed: int = 0) -> None:
        spec = job.env.formatter
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        if name in CHAT_FORMATTERS:
            raise ConfigError(
                f"verl-agent puts each env's observation text in one user message, but "
                f"env.formatter={name!r} makes chat message lists: pass a text formatter, e.g. "
                "env.formatter=simple",
                key="env.formatter",
            )
        if env_num < 1 or group_n < 1:
            raise ValueError(f"env_num and group_n must be >= 1, got {env_num} and {group_n}")
        from agent_memory.rollout.bank import build_env

        self.job = job
        self.env_num = env_num
        self.group_n = group_n
        self.num_envs = env_num * group_n
        self.envs = build_env(job, self.num_envs)
        self._next_seed = seed
        self.seeds: list[int] = []
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._texts: list[str] = [""] * self.num_envs
        self._anchors: list[str] = [""] * self.num_envs
        self._raw: list[str] = [""] * self.num_envs  # the env's own observation (GiGPO's anchor)
        self._infos: list[dict[str, Any]] = [dict(_BLANK) for _ in range(self.num_envs)]
        self._turn = np.zeros(self.num_envs, dtype=bool)

    def reset(self, kwargs: Any = None) -> tuple[Observations, list[dict[str, Any]]]:
        """Start a new episode in every env; returns the observations and one info per env.

        Args:
            kwargs: one ``{"seed": int}`` per env (a 1-D numpy object array, list or tuple), as
                verl-agent passes ``env_kwargs``; None: the groups get the manager's next seeds.

        Raises:
            TypeError: ``kwargs`` is not one of those containers, or a row is not a dict.
            ValueError: not one row per env, a 2-D array, other keys than ``seed``, a bad seed.
        """
        seeds = self._seeds(kwargs)
        prompts, info = self.envs.reset(seed=seeds)
        self.seeds = seeds
        self._done[:] = False
        self._turn[:] = False
        self._infos = [dict(_BLANK) for _ in range(self.num_envs)]
        self._update(prompts, info, np.ones(self.num_envs, dtype=bool))
        self._ask_turns(list(range(self.num_envs)))
        return self._observations(), [dict(i) for i in self._infos]

    def step(
        self, text_actions: Sequence[str]
    ) -> tuple[Observations, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Act with one decoded response per env (finished envs' responses are ignored).

        Returns ``(observations, rewards, dones, infos)``: float32 and bool arrays of shape
        ``(B,)`` (a finished env: 0 and True) and one info per env with the keys ``INFO_KEYS``.
        """
        actions = [str(a) for a in np.asarray(text_actions, dtype=object).reshape(-1)]
        if len(actions) != self.num_envs:
            raise ValueError(
                f"expected {self.num_envs} text actions (one per env), got {len(actions)}"
            )
        acting = ~self._done
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        dones = self._done.copy()
        answering = acting & self._turn
        stepping = acting & ~self._turn
        if answering.any():
            self._answer_turns(np.flatnonzero(answering).tolist(), actions)
        if stepping.any():
            prompts, reward, terminated, truncated, info = self.envs.step(actions, mask=stepping)
            rewards[stepping] = np.asarray(reward, dtype=np.float32)[stepping]
            ended = (np.asarray(terminated) | np.asarray(truncated)) & stepping
            dones |= ended
            self._update(prompts, info, stepping)
            self._done |= ended
            self._ask_turns(np.flatnonzero(stepping & ~ended).tolist())
        infos = [dict(self._infos[i], active=bool(acting[i])) for i in range(self.num_envs)]
        for item in infos:
            if not item["active"]:
                item["invalid_penalty"] = 0.0  # a held env's reward is 0: no penalty in it
        return self._observations(), rewards, dones, infos

    def success_evaluator(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """verl-agent's: each env's ``won`` at its last active step, as ``success_rate``."""
        total_infos = kwargs["total_infos"]
        total_batch_list = kwargs["total_batch_list"]
        success: dict[str, list[float]] = {"success_rate": []}
        for bs in range(len(total_batch_list)):
            for i in reversed(range(len(total_batch_list[bs]))):
                if total_batch_list[bs][i]["active_masks"]:
                    success["success_rate"].append(float(total_infos[bs][i]["won"]))
                    break
        if len(success["success_rate"]) != len(total_batch_list):
            raise ValueError(
                "success_evaluator: every env needs at least one active step in total_batch_list "
                f"(found {len(success['success_rate'])} of {len(total_batch_list)})"
            )
        return {key: np.array(value) for key, value in success.items()}

    def close(self) -> None:
        """Close the memory and the envs."""
        self.envs.close()

    # ------------------------------------------------------------------ internals

    def _seeds(self, kwargs: Any) -> list[int]:
        if kwargs is None:  # the dataset has no env_kwargs column
            base = self._next_seed
            self._next_seed += self.env_num
            return [base + i // self.group_n for i in range(self.num_envs)]
        n = self.num_envs
        if isinstance(kwargs, np.ndarray):
            # verl-agent's non_tensor_batch entries are 1-D (one row per sample); a 2-D array
            # has no row order to match envs by, so it is refused rather than flattened.
            if kwargs.ndim != 1:
                raise ValueError(
                    f"env_kwargs: expected a 1-D array of {n} dicts (one per env), "
                    f"got shape {kwargs.shape}"
                )
            rows = kwargs.tolist()
        elif isinstance(kwargs, Sequence) and not isinstance(kwargs, (str, bytes)):
            rows = list(kwargs)
        else:
            raise TypeError(
                f"env_kwargs: expected None, a list, a tuple or a 1-D numpy object array of {n} "
                f"dicts (one per env), got {type(kwargs).__name__}"
            )
        if len(rows) != n:
            raise ValueError(
                f"env_kwargs: expected {n} dicts (one per env: env_num={self.env_num} x "
                f"group_n={self.group_n}), got {len(rows)}"
            )
        seeds = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"env_kwargs[{i}]: expected a dict, got {type(row).__name__}")
            # Any other key would be dropped (the envs take a seed only), so it is refused.
            if set(row) != set(ROW_KEYS):
                raise ValueError(
                    f"env_kwargs[{i}]: expected the keys {list(ROW_KEYS)} (the env's reset "
                    f"seed), got {sorted(str(k) for k in row)}"
                )
            seed = row["seed"]
            if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
                raise ValueError(
                    f"env_kwargs[{i}]['seed']: expected a non-negative int, got {seed!r}"
                )
            seeds.append(int(seed))
        return seeds

    def _update(self, prompts: Sequence[Any], info: Mapping[str, Any], acting: np.ndarray) -> None:
        for i in np.flatnonzero(acting).tolist():
            prompt = prompts[i]
            if not isinstance(prompt, str):
                raise ConfigError(
                    f"env {i}'s prompt is a {type(prompt).__name__}, not text: verl-agent puts "
                    "each observation in one user message: pass a text formatter, e.g. "
                    "env.formatter=simple",
                    key="env.formatter",
                )
            self._texts[i] = prompt
            self._anchors[i] = self._raw[i] = str(env_value(info, "raw_obs", i, ""))
            for key, default in _BLANK.items():  # each value cast to its default's type
                if key != "active":
                    value = env_value(info, key, i, default)
                    self._infos[i][key] = value if default is None else type(default)(value)

    def _ask_turns(self, ids: list[int]) -> None:
        """Show the memory's turn (its prompt, also as the anchor: no env state) to the envs of
        ``ids`` whose memory asks the policy for one before their next action."""
        for i, text in self.envs.memory.turn_prompts(ids).items():
            self._turn[i] = True
            self._texts[i] = self._anchors[i] = text
            self._infos[i].update(memory_turn=True, is_action_valid=True, invalid_reason=None)
            self._infos[i].update(parsed_action=None, invalid_penalty=0.0)

    def _answer_turns(self, ids: list[int], actions: Sequence[str]) -> None:
        """Give the memory the responses of ``ids`` to its turns; their next observation is the
        action prompt the answer rebuilt (an answer it could not use is invalid, reward 0)."""
        why, figures = self.envs.answer_memory({i: actions[i] for i in ids})
        prompts = self.envs.prompts
        for i in ids:
            self._infos[i]["history_steps"] = int(figures["history_steps"][i])
            self._turn[i] = False
            self._texts[i] = str(prompts[i])
            self._anchors[i] = self._raw[i]
            self._infos[i].update(memory_turn=False, is_action_valid=why[i] is None)
            self._infos[i].update(invalid_reason=why[i], parsed_action=None, invalid_penalty=0.0)
        self._ask_turns(ids)

    def _observations(self) -> Observations:
        return {"text": list(self._texts), "image": None, "anchor": list(self._anchors)}
