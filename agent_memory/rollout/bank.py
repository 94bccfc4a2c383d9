"""``EnvBank``: one wrapped vector env of many sub-envs, driven episode by episode in this process.

It builds the envs (:func:`build_env`, the one way to build a wrapped vector env), starts
episodes (partial resets, seeded per group), steps the envs that answered (the others held) and
reports each env's next :class:`PromptView`. No Ray: a rollout worker, the reference loop, the
TRL and verl-agent adapters and the trainer each hold one; its types never cross processes.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig
    >>> from agent_memory.rollout.messages import EpisodeAssignment
    >>> bank = EnvBank(JobConfig(env=EnvConfig(id="agent_memory/Recall-v0")), num_envs=2)
    >>> (start,) = bank.reset_envs([EpisodeAssignment(env=1, traj_uid="t", group_uid="g", seed=3)])
    >>> start.env, start.error, start.view.history_steps
    (1, None, 0)
    >>> (res,) = bank.step({1: "<action>next</action>"})
    >>> res.is_action_valid, res.done, res.next.history_steps
    (True, False, 1)
    >>> bank.close()
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_memory.config import JobConfig
from agent_memory.failures import describe_exception
from agent_memory.protocol import Prompt
from agent_memory.rollout.history import job_memory, wrapper_settings
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.rollout.worker.watchdog import CallMarks, CallWatchdog, MarkCalls, kill_processes
from agent_memory.tokens import make_token_counter
from agent_memory.tool_actions import MEMORY_TOOLS, env_tools
from agent_memory.wrappers import Holdable, VectorHistoryWrapper
from agent_memory.wrappers.errors import CatchErrors
from agent_memory.wrappers.vector_env import env_value, env_values

__all__ = ["EnvBank", "PromptView", "ResetResult", "StepResult", "build_env"]


@dataclass(frozen=True)
class PromptView:
    """One env's next prompt, its figures, and what the policy asked for.

    Attributes:
        prompt: what the policy answers.
        context_tokens: the prompt's tokens (the configured token counter).
        context_chars: the prompt's characters.
        history_steps: past steps shown in the prompt.
        meta: the fields the policy lists in ``Policy.needs`` (admissible actions, oracle...).
        observation: the env's current observation as text, without history or template.

    Example:
        >>> PromptView(prompt="Go.", context_tokens=1, context_chars=3, history_steps=0).meta
        {}
    """

    prompt: Prompt
    context_tokens: int
    context_chars: int
    history_steps: int
    meta: dict[str, Any] = field(default_factory=dict)
    observation: str | None = None


@dataclass(frozen=True)
class StepResult:
    """What came of one env's step.

    ``reward`` includes the invalid-action penalty; ``truncated`` (time limit or ``error``) is
    False when ``terminated``; ``is_action_valid`` else ``invalid_reason``. ``error``: the
    traceback's last lines when the env or its memory failed. ``next``: the prompt after the step.

    Example:
        >>> view = PromptView(prompt="Go.", context_tokens=1, context_chars=3, history_steps=0)
        >>> StepResult(env=0, reward=1.0, terminated=True, truncated=False, is_action_valid=True,
        ...            next=view).done
        True
    """

    env: int
    reward: float
    terminated: bool
    truncated: bool
    is_action_valid: bool
    next: PromptView
    invalid_reason: str | None = None
    parsed_action: Any = None
    thought: str | None = None
    memory_flag: str | None = None
    #: The tokens of the memory's note after the step (``info["memory_note_tokens"]``).
    memory_note_tokens: int | None = None
    state_key: str | None = None
    won: bool = False
    error: str | None = None
    #: The memory's turn that comes before the next action (``BaseMemory.turn_prompts``).
    memory_turn: PromptView | None = None

    @property
    def done(self) -> bool:
        """The episode ended with this step."""
        return self.terminated or self.truncated or self.error is not None


@dataclass(frozen=True)
class ResetResult:
    """An episode's first prompt, or the error its env's reset raised.

    Example:
        >>> ResetResult(env=2, view=None, error="ValueError: no such level").view is None
        True
    """

    env: int
    view: PromptView | None
    error: str | None = None


def _make_env(
    env_id: str,
    max_steps: int | None,
    kwargs: Mapping[str, Any],
    marks: CallMarks | None,
    index: int,
) -> gym.Env:
    import agent_memory.envs  # noqa: F401  (registers the bundled ids in this process)

    extra: dict[str, Any] = {} if max_steps is None else {"max_episode_steps": max_steps}
    env = gym.make(env_id, **extra, **dict(kwargs))
    return env if marks is None else MarkCalls(env, marks, index)


def _make_sub_env(
    env_id: str,
    max_steps: int | None,
    kwargs: Mapping[str, Any],
    marks: CallMarks | None = None,
    index: int = 0,
) -> gym.Env:
    make = partial(_make_env, env_id, max_steps, kwargs, marks, index)
    # Holdable outermost: a parked (held) env touches neither the env nor its call marks.
    return Holdable(CatchErrors(make(), make=make))


def build_env(
    job: JobConfig, num_envs: int, marks: CallMarks | None = None
) -> VectorHistoryWrapper:
    """The wrapped vector env a bank drives: ``num_envs`` sub-envs of ``job.env``, DISABLED
    autoreset, history per ``job.memory``; with ``marks``, every env call is marked there.

    Example:
        >>> from agent_memory.config import EnvConfig, JobConfig
        >>> env = build_env(JobConfig(env=EnvConfig(id="agent_memory/Recall-v0")), 2)
        >>> prompts, info = env.reset(seed=[0, 1])
        >>> len(prompts), info["history_steps"].tolist()
        (2, [0, 0])
        >>> env.close()
    """
    fns = [
        partial(_make_sub_env, job.env.id, job.env.max_steps, dict(job.env.kwargs), marks, i)
        for i in range(num_envs)
    ]
    venv: AsyncVectorEnv | SyncVectorEnv
    if job.rollout.vectorization == "async":
        venv = AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=AutoresetMode.DISABLED)
    else:
        # copy=False: the wrapper turns each observation into text within the step, so
        # Gymnasium's deep copy of every sub-env's observation, acting or held, buys nothing.
        venv = SyncVectorEnv(fns, copy=False, autoreset_mode=AutoresetMode.DISABLED)
    counter = make_token_counter(job.memory.token_counter)
    memory = job_memory(job, num_envs, counter)
    return VectorHistoryWrapper(venv, **wrapper_settings(job, memory, counter))


class EnvBank:
    """``num_envs`` sub-envs of ``job``'s env, one episode at a time each; nothing is reset until
    an env gets an episode.

    Args:
        job: the env, memory, template, parser, ``rollout.vectorization`` and ``step_timeout_s``.
        num_envs: sub-envs in the vector env.
        meta_fields: per-env fields the policy needs besides the prompt (``Policy.needs``).
        marks: where every env call is marked (for a worker's next process to read after a
            crash; a watchdog enforces ``rollout.step_timeout_s``). None: no marks, no limit.
        name: how errors name this bank (e.g. ``"worker 3"``).

    Attributes:
        env: the wrapped vector env (:func:`build_env`).
        live: per env, whether it plays an episode that has not ended.
    """

    def __init__(
        self,
        job: JobConfig,
        num_envs: int,
        meta_fields: Collection[str] = (),
        marks: CallMarks | None = None,
        name: str = "env bank",
    ) -> None:
        self.num_envs = num_envs
        self.meta_fields = set(meta_fields)
        self.marks = marks
        self.name = name
        self.live = np.zeros(num_envs, dtype=bool)
        self.state_keys: list[str | None] = [None] * num_envs
        self.views: list[PromptView | None] = [None] * num_envs
        self.watchdog: CallWatchdog | None = None
        self.env = build_env(job, num_envs, marks)
        limit = job.rollout.step_timeout_s
        if limit is not None and marks is not None:
            inner = self.env.unwrapped
            procs = list(inner.processes) if isinstance(inner, AsyncVectorEnv) else []
            self.watchdog = CallWatchdog(marks, limit, partial(kill_processes, procs))

    def reset_envs(
        self, assignments: Sequence[EpisodeAssignment], park: Sequence[int] = ()
    ) -> list[ResetResult]:
        """Start the assigned episodes; the envs in ``park`` have nothing to play (untouched
        until they get an episode). Returns each assigned env's first prompt, or the error its
        reset raised (every assignment's, when the reset call itself fails)."""
        self.live[list(park)] = False
        if not assignments:
            return []
        mask = np.zeros(self.num_envs, dtype=bool)
        seeds: list[int | None] = [None] * self.num_envs
        for a in assignments:
            mask[a.env], seeds[a.env] = True, a.seed
        started = [a.env for a in assignments]
        self.live[started] = False
        if self.marks is not None:  # a crash from here on names the new episode
            for a in assignments:
                self.marks.playing(a.env, a.traj_uid)
        try:
            self.env.memory.set_groups(started, [a.group_uid for a in assignments])
            prompts, info = self.env.reset(seed=seeds, options={"reset_mask": mask})
            views = self._views(started, prompts, info, acting=started)
        except Exception as e:
            self._end_process_if_broken()
            error = describe_exception(e)
            return [ResetResult(i, None, error) for i in started]
        out = []
        for i in started:
            self.state_keys[i] = env_value(info, "state_key", i)
            error = env_value(info, "error", i)
            if error is not None:  # the env failed to reset: the episode ends right away
                out.append(ResetResult(i, None, error))
                continue
            self.live[i] = True
            self.views[i] = views[i]
            out.append(ResetResult(i, views[i]))
        return out

    def step(self, responses: Mapping[int, Any], turns: Collection[int] = ()) -> list[StepResult]:
        """Step the live envs of ``responses``, holding every other; per stepped env, its
        outcome, next prompt and memory turn (if one comes before the next action). Responses of
        ``turns`` envs answer their memory's turn instead (the env is not stepped). A finished
        env needs :meth:`reset_envs` before its next step.

        Raises:
            ValueError: an env of ``responses`` plays no episode (never started, or ended).
        """
        unknown = [i for i in responses if not (0 <= i < self.num_envs and self.live[i])]
        if unknown:
            raise ValueError(
                f"{self.name}: env(s) {unknown} have no running episode: step only envs that "
                "reset_envs started and whose episode has not ended (StepResult.done)"
            )
        answered = sorted(i for i in responses if i in turns)
        out = self._answer_turns(answered, responses) if answered else []
        if len(answered) < len(responses):
            out += self._step_envs(
                responses
                if not answered
                else {i: r for i, r in responses.items() if i not in turns}
            )
        return out

    def close(self) -> None:
        """Stop the watchdog; close the envs and the memory."""
        if self.watchdog is not None:
            self.watchdog.stop()
        self.env.close()

    def _answer_turns(self, ids: list[int], responses: Mapping[int, Any]) -> list[StepResult]:
        """Give the memory the policy's answers to its turns; each env's next prompt."""
        try:
            why, figures = self.env.answer_memory({i: str(responses[i]) for i in ids})
            views = self._views(ids, self.env.prompts, figures, acting=ids)
        except Exception as e:
            return self._failed_step(ids, describe_exception(e))
        out = []
        for i in ids:
            self.views[i] = views[i]
            out.append(StepResult(i, 0.0, False, False, why[i] is None, views[i], why[i]))
        return out

    def _memory_turns(self, ids: list[int]) -> dict[int, PromptView]:
        """The prompts of the memory turns that the envs of ``ids`` wait for."""
        count = self.env.token_counter
        return {
            i: PromptView(
                text, context_tokens=count(text), context_chars=len(text), history_steps=0
            )
            for i, text in self.env.memory.turn_prompts(ids).items()
        }

    def _step_envs(self, responses: Mapping[int, Any]) -> list[StepResult]:
        stepped = sorted(responses)  # only these are touched: the cost follows the acting envs
        actions: list[Any] = [None] * self.num_envs
        for i in stepped:
            actions[i] = responses[i]
        acting = np.zeros(self.num_envs, dtype=bool)
        acting[stepped] = True
        try:
            prompts, rewards, terminated, truncated, info = self.env.step(actions, mask=acting)
            done = np.logical_or(terminated, truncated)
            # The oracle only for envs that act again (a finished env's prompt is never answered).
            going = [i for i in stepped if not done[i]]
            views = self._views(stepped, prompts, info, acting=going)
            turns = self._memory_turns(going)
        except Exception as e:
            self._end_process_if_broken()
            return self._failed_step(stepped, describe_exception(e))
        values = {
            key: env_values(info, key, stepped, default)
            for key, default in (
                ("error", None),
                ("is_action_valid", True),
                ("invalid_reason", None),
                ("parsed_action", None),
                ("thought", None),
                ("won", False),
                ("state_key", None),
                ("memory_flag", None),
                ("memory_note_tokens", None),
            )
        }
        out = []
        for j, i in enumerate(stepped):
            error = values["error"][j]
            term = bool(terminated[i])
            result = StepResult(
                env=i,
                reward=float(rewards[i]),
                terminated=term,
                truncated=bool(truncated[i] or error is not None) and not term,
                is_action_valid=bool(values["is_action_valid"][j]),
                invalid_reason=values["invalid_reason"][j],
                parsed_action=values["parsed_action"][j],
                thought=values["thought"][j] or None,
                memory_flag=values["memory_flag"][j],
                state_key=self.state_keys[i],
                memory_note_tokens=values["memory_note_tokens"][j],
                won=bool(values["won"][j]),
                error=error,
                next=views[i],
                memory_turn=turns.get(i) if error is None else None,
            )
            self.state_keys[i] = values["state_key"][j]
            self.views[i] = views[i]
            if result.done:
                self.live[i] = False
            out.append(result)
        return out

    def _failed_step(self, stepped: list[int], error: str) -> list[StepResult]:
        """The step call raised: every env of the call ends its episode with ``error``."""
        out = []
        for i in stepped:
            view = self.views[i]
            assert view is not None  # a live env has shown a prompt
            out.append(StepResult(i, 0.0, False, True, False, view, error=error))
            self.live[i] = False
        return out

    def _end_process_if_broken(self) -> None:
        """An async vector env whose sub-env process died cannot step again: end this process
        (its call marks name the env) so that Ray starts a fresh one."""
        inner = self.env.unwrapped
        if isinstance(inner, AsyncVectorEnv) and not all(p.is_alive() for p in inner.processes):
            kill_processes(list(inner.processes))
            os._exit(70)

    def _views(
        self, ids: list[int], prompts: Any, info: Mapping[str, Any], acting: list[int]
    ) -> dict[int, PromptView]:
        """The prompts of ``ids`` with their figures and the policy's meta fields (the oracle's
        action for the envs in ``acting`` when the policy needs it, computed once per batch)."""
        oracles = self._oracles(acting) if "oracle_action" in self.meta_fields else {}
        tokens, chars, steps = (
            dict(zip(ids, info[key][ids].tolist(), strict=True))
            for key in ("context_tokens", "context_chars", "history_steps")
        )
        # The memory's own tools (memory=notes write_with=tools), the same for every env.
        memory_tools = list(self.env.memory.tools) if MEMORY_TOOLS in self.meta_fields else None
        views = {}
        for i in ids:
            now = self.env.current(i)
            meta: dict[str, Any] = {}
            if "admissible_actions" in self.meta_fields:
                actions = now.admissible_actions
                meta["admissible_actions"] = None if actions is None else list(actions)
            if "task" in self.meta_fields:
                meta["task"] = now.task  # as the prompt shows it
            if "tools" in self.meta_fields:  # declared, else act() of the admissible actions
                meta["tools"] = env_tools(now.tools, now.admissible_actions)
            if memory_tools:  # offered beside those (Policy.needs has it with any tools)
                meta[MEMORY_TOOLS] = memory_tools
            if "raw_obs" in self.meta_fields:
                meta["raw_obs"] = now.observation
            if "memory_candidates" in self.meta_fields:
                meta["memory_candidates"] = self.env.memory.candidates(i, now.observation)
            if i in oracles:
                meta["oracle_action"] = oracles[i]
            views[i] = PromptView(
                prompt=prompts[i],
                context_tokens=int(tokens[i]),
                context_chars=int(chars[i]),
                history_steps=int(steps[i]),
                meta=meta,
                observation=now.observation,
            )
        return views

    def _oracles(self, ids: list[int]) -> dict[int, Any]:
        if not ids:
            return {}
        inner = self.env.unwrapped
        if isinstance(inner, SyncVectorEnv):
            return {i: inner.envs[i].get_wrapper_attr("oracle_action")() for i in ids}
        assert isinstance(inner, AsyncVectorEnv)
        every = inner.call("oracle_action")  # async: one call reaches every sub-env at once
        return {i: every[i] for i in ids}
