"""``VectorHistoryWrapper``: a Gymnasium vector-env wrapper that owns each sub-env's history."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.logger import warn
from gymnasium.vector import (
    AsyncVectorEnv,
    AutoresetMode,
    VectorEnv,
    VectorWrapper,
    async_vector_env,
)
from gymnasium.vector.utils import batch_space

from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.tokens import TokenCounterSpec
from agent_memory.wrappers.core import HistoryCore, OwnsHistory, PromptText, object_array

__all__ = ["VectorHistoryWrapper"]


def _has_text(space: spaces.Space) -> bool:
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, spaces.Dict):
        return any(_has_text(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return any(_has_text(s) for s in space.spaces)
    return False


@functools.cache
def async_worker_keeps_autoreset() -> bool:
    """Whether Gymnasium's AsyncVectorEnv worker keeps a pending autoreset across ``reset`` when
    it has no shared memory (the Gymnasium 1.4 bug). Read from the worker's source, so a fixed
    Gymnasium turns the workaround off by itself."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(async_vector_env._async_worker)))
    except (OSError, TypeError, SyntaxError):
        return True  # cannot tell: assume the behaviour of the pinned Gymnasium 1.4
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and any(
                isinstance(c, ast.Constant) and c.value == "reset" for c in node.test.comparators
            )
        ):
            # Fixed when the reset branch itself (not a nested `if shared_memory:`) clears it.
            return not any(
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "autoreset" for t in stmt.targets)
                for stmt in node.body
            )
    return True


#: The info keys the wrapper reads per env (the rest of the info passes through untouched).
_WANTED = ("task", "admissible_actions", "is_action_valid", "invalid_reason", "won")


def _info_at(info: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s values of the keys the wrapper reads from a vector info dict (Gymnasium's
    ``key`` / ``_key`` convention)."""
    out = {}
    for key in _WANTED:
        value = info.get(key)
        if value is not None:
            mask = info.get(f"_{key}")
            if mask is None or mask[i]:
                out[key] = value[i]
    return out


class VectorHistoryWrapper(OwnsHistory, VectorWrapper):
    """Owns one interaction history per sub-env: stores each step, renders each env's prompt.

    On ``step(responses)`` it parses each model response into the env's action (when a
    ``parser`` is given), steps the inner env, stores for every env that really stepped the
    observation its action was taken on, the action and the thought (plus any ``extras``), and
    returns one prompt per env built from the task, the step count, the history, the current
    observation and the admissible actions. Episode boundaries follow the inner env's
    ``autoreset_mode``:

    * ``NEXT_STEP``: the step after a done is the env's reset step; its response is ignored by
      the env and is not stored, and the history restarts from the reset observation.
    * ``SAME_STEP``: the last step is stored, the episode (with ``info["final_obs"]`` as its
      final observation) is handed over, and the history restarts from the reset observation.
    * ``DISABLED``: a finished env waits for ``reset(options={"reset_mask": mask})``; only the
      masked envs' histories are cleared (the mask is read before the inner env pops it).

    A finished episode is handed over in ``info["episode_history"]`` (``_episode_history``
    masks the envs) on the step it ends, before its history is ever cleared; a ``reset()`` hands
    over unfinished episodes it discards. ``info`` also gets, per env: ``raw_obs`` (the env's
    observation text), ``history_steps``, ``context_chars``, ``context_tokens`` (with the
    configured counter), ``episode_step`` (steps taken in the episode) and, with a parser,
    ``is_action_valid``, ``invalid_reason``, ``parsed_action``, ``thought`` and
    ``invalid_penalty`` (the explicit reward term added for invalid actions).

    Args:
        env: any ``gymnasium.vector.VectorEnv`` (Sync, Async with ``shared_memory=False`` for
            text observations, ``make_vec`` with ``wrappers=...``, or your own).
        history_length: steps of history in the prompt: 0 none, -1 whole episode, k last k.
        memory: a memory strategy (:mod:`agent_memory.memory`); by default a
            :class:`~agent_memory.memory.HistoryMemory` built from the arguments below.
        formatter: how steps are written into the prompt (``simple``, ``search``, ``code``,
            ``chat``, ``jinja`` or a registered name).
        template: the task's :class:`~agent_memory.prompts.PromptTemplate` (or its config).
        parser: turns model responses into env actions (None: responses go to the env as is).
        token_counter: counts the figures' tokens and the budgets (see :mod:`agent_memory.tokens`).
        max_tokens: token budget of the history part of each prompt.
        max_prompt_tokens: token budget of each whole prompt: history gets what the rest of the
            prompt leaves (the newest whole steps that fit).
        bounded: keep only ``history_length`` steps per env (O(window) memory); handed-over
            episodes then hold only the last steps (``first_step`` says where they start).
        obs_to_text: turns an inner observation into text (default: ``str``).

    Example:
        >>> import gymnasium as gym
        >>> import envs  # registers the bundled text envs
        >>> from agent_memory.parsing import ActionParser
        >>> from agent_memory.wrappers import VectorHistoryWrapper
        >>> venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
        >>> env = VectorHistoryWrapper(venv, history_length=2, parser=ActionParser())
        >>> prompts, info = env.reset(seed=0)
        >>> prompts, rewards, terminated, truncated, info = env.step(
        ...     ["<think>ok</think><action>next</action>", "no tags"])
        >>> info["is_action_valid"].tolist(), info["history_steps"].tolist()
        ([True, False], [1, 1])
        >>> info["invalid_reason"][1]
        'no <action>...</action> tag in the response'
        >>> step = env.memory[0][0]
        >>> step["action"], step["thought"], step["observation"].splitlines()[0]
        ('next', 'ok', 'Remember this: the balloon is BROWN.')
        >>> env.memory[1][0]["action"]
        '[invalid: no <action>...</action> tag in the response]'
        >>> env.close()
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        history_length: int = 3,
        memory: BaseMemory | None = None,
        formatter: FormatterSpec = "simple",
        template: PromptTemplate | Mapping[str, Any] | str | None = None,
        parser: ActionParser | None = None,
        token_counter: TokenCounterSpec = "estimate",
        max_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
        bounded: bool = False,
        obs_to_text: Callable[[Any], str] | None = None,
    ) -> None:
        super().__init__(env)
        self._mode = self._autoreset_mode(env)
        inner = env.unwrapped
        self._async = isinstance(inner, AsyncVectorEnv)
        text_on_shm = _has_text(env.single_observation_space)
        if self._async and getattr(inner, "shared_memory", False) and text_on_shm:
            raise ValueError(
                "AsyncVectorEnv with shared_memory=True returns stale '000...' observations "
                "for Text spaces (Gymnasium 1.4): build it with shared_memory=False, e.g. "
                "gym.make_vec(id, n, vectorization_mode='async', "
                "vector_kwargs={'shared_memory': False})"
            )
        self._core = HistoryCore(
            self.num_envs, history_length=history_length, memory=memory, formatter=formatter,
            template=template, parser=parser, token_counter=token_counter,
            max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens, bounded=bounded,
            obs_to_text=obs_to_text,
        )  # fmt: skip
        self.single_observation_space = PromptText()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        if parser is not None:
            self.single_action_space = PromptText()
            self.action_space = batch_space(self.single_action_space, self.num_envs)
        # Envs whose next step is the inner env's autoreset (NEXT_STEP), and finished envs that
        # wait for a masked reset (DISABLED).
        self._pending_reset = np.zeros(self.num_envs, dtype=bool)
        self._finished = np.zeros(self.num_envs, dtype=bool)
        self._warned_async = False

    # ------------------------------------------------------------------ public

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The inner env's autoreset mode."""
        return self._mode

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Reset all envs, or only those in ``options["reset_mask"]``; start their histories."""
        mask = None
        if options is not None:
            options = dict(options)  # the inner env pops reset_mask: keep the caller's dict intact
            if "reset_mask" in options:
                mask = np.array(options["reset_mask"], copy=True)
        ids = list(range(self.num_envs)) if mask is None else self._mask_ids(mask)
        discarded = [
            i for i in ids if not self._core.handed_over[i] and self.memory.num_steps(i) > 0
        ]
        handed = self._core.handover(
            discarded, [self._core.last_obs[i] for i in discarded],
            [False] * len(discarded), [False] * len(discarded),
        )  # fmt: skip
        again = self._reset_again_on_next_step(ids)
        obs, info = self.env.reset(seed=seed, options=options)
        texts = [self._core.obs_to_text(obs[i]) for i in ids]
        self._core.start(ids, texts, [_info_at(info, i) for i in ids])
        self._pending_reset[ids] = False
        self._pending_reset[again] = True
        self._finished[ids] = False
        prompts, figures = self._core.prompts()
        self._add_figures(info, figures)
        info["raw_obs"] = object_array([self._core.last_obs[i] for i in range(self.num_envs)])
        info["_raw_obs"] = np.ones(self.num_envs, dtype=bool)
        self._add_handover(info, discarded, handed)
        return tuple(prompts), info

    def step(
        self, actions: Sequence[Any], extras: Mapping[str, Sequence[Any]] | None = None
    ) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with the model's responses (one per env) and return the new prompts.

        Args:
            actions: one response (or env action, without a parser) per env. Envs that are
                finished or resetting may get any value (e.g. ``None``); it is ignored.
            extras: more per-env values to store with this step (e.g. ``{"logprob": [...]}``);
                one value per env, keys fixed per episode.
        """
        n = self.num_envs
        if isinstance(actions, (str, bytes)) or len(actions) != n:
            got = type(actions).__name__ if isinstance(actions, (str, bytes)) else len(actions)
            raise ValueError(f"expected {n} actions (one per env), got {got}")
        if extras is not None:
            for key, values in extras.items():
                if isinstance(values, (str, bytes)) or len(values) != n:
                    raise ValueError(f"extras[{key!r}] must hold {n} values (one per env)")
        if self._mode == AutoresetMode.DISABLED and self._finished.any():
            raise RuntimeError(
                f"env(s) {np.flatnonzero(self._finished).tolist()} finished their episode and "
                "autoreset_mode is DISABLED: call reset(options={'reset_mask': mask}) for them "
                "before stepping"
            )
        resetting = self._pending_reset.copy()
        live_ids = np.flatnonzero(~resetting).tolist()
        core = self._core
        parser = core.parser
        env_actions = list(actions)
        parsed = {}
        replies: dict[int, str] = {}
        if parser is not None:
            # Memory actions (<record>, <retrieve>) go to the memory; their env gets a no-op.
            replies = core.intercept(actions, live_ids)
            parsed = core.parse(actions, [i for i in live_ids if i not in replies])
            fallback = parser.fallback_action()
            env_actions = [
                p.action if (p := parsed.get(i)) is not None and p.valid else fallback
                for i in range(n)
            ]
        obs, rewards, terminated, truncated, info = self.env.step(self._batch(env_actions))
        # A copy: the penalty must not touch the env's own buffers.
        rewards = np.array(rewards, dtype=np.float64)
        done = np.logical_or(terminated, truncated)
        texts = [core.obs_to_text(o) for o in obs]

        # 1. Store the step of every env that really stepped (a memory action as written).
        if parser is not None:
            texts_of = [
                parsed[i].text if i in parsed else core.memory_action_text(actions[i])
                for i in live_ids
            ]
            thoughts = [parsed[i].thought if i in parsed else "" for i in live_ids]
            core.store(live_ids, texts_of, thoughts if parser.think_tag else None, extras)
        else:
            core.store(live_ids, [actions[i] for i in live_ids], None, extras)

        # 2. Validity and the invalid-action penalty (the env's own verdict counts too).
        if parser is not None:
            self._add_validity(info, parsed, replies, live_ids, done, rewards)
        core.returns[live_ids] += rewards[live_ids]

        # 3. Episode boundaries, per autoreset mode.
        ended = [i for i in live_ids if done[i]]
        going = [i for i in live_ids if not done[i]]
        core.observe(going, [texts[i] for i in going], [_info_at(info, i) for i in going])
        if self._mode == AutoresetMode.NEXT_STEP:
            restarted = np.flatnonzero(resetting).tolist()
            core.start(
                restarted, [texts[i] for i in restarted], [_info_at(info, i) for i in restarted]
            )
            finals = [texts[i] for i in ended]
            self._pending_reset = done.copy()
        elif self._mode == AutoresetMode.SAME_STEP:
            finals = [core.obs_to_text(info["final_obs"][i]) for i in ended]
        else:  # DISABLED
            finals = [texts[i] for i in ended]
            self._finished[ended] = True
        won = [bool(self._step_info(info, i, done).get("won", False)) for i in ended]
        handed = core.handover(ended, finals, terminated[ended], truncated[ended], won)
        if self._mode == AutoresetMode.SAME_STEP:
            core.start(ended, [texts[i] for i in ended], [_info_at(info, i) for i in ended])
        elif ended:  # the final observation is what the env shows until it resets
            core.observe(ended, finals, [{} for _ in ended])

        prompts, figures = core.prompts()
        self._add_figures(info, figures)
        info["raw_obs"] = object_array(texts)
        info["_raw_obs"] = np.ones(n, dtype=bool)
        self._add_handover(info, ended, handed)
        return tuple(prompts), rewards, terminated, truncated, info

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _autoreset_mode(env: VectorEnv) -> AutoresetMode:
        mode = env.metadata.get("autoreset_mode")
        if mode is None:
            warn(
                f"{env} has no 'autoreset_mode' in its metadata: VectorHistoryWrapper assumes "
                "AutoresetMode.NEXT_STEP (Gymnasium's default)"
            )
            return AutoresetMode.NEXT_STEP
        try:
            return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)
        except ValueError:
            raise ValueError(
                f"unknown autoreset_mode {mode!r} in env.metadata: expected one of "
                f"{[m.value for m in AutoresetMode]}"
            ) from None

    def _mask_ids(self, mask: np.ndarray) -> list[int]:
        if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
            raise ValueError(
                f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), "
                f"got dtype {mask.dtype} shape {mask.shape}"
            )
        return np.flatnonzero(mask).tolist()

    def _reset_again_on_next_step(self, ids: list[int]) -> list[int]:
        """Envs of ``ids`` that Gymnasium's AsyncVectorEnv will reset again on the next step.

        Gymnasium 1.4 bug: with ``shared_memory=False`` a worker clears its pending NEXT_STEP
        autoreset on ``reset`` only in the shared-memory branch, so an env that finished before
        a manual reset is reset again, unseeded, on the next step (its action ignored). The
        wrapper then treats that step as the env's reset step, so the history stays exact.
        """
        if not (self._async and self._mode == AutoresetMode.NEXT_STEP):
            return []
        if getattr(self.env.unwrapped, "shared_memory", True) or not async_worker_keeps_autoreset():
            return []
        again = [i for i in ids if self._pending_reset[i]]
        if again and not self._warned_async:
            self._warned_async = True
            warn(
                f"AsyncVectorEnv(shared_memory=False) will reset env(s) {again} again on the next "
                "step (a Gymnasium 1.4 bug after a manual reset of finished envs): their next "
                "actions are ignored and the seeds just given to them are lost. Use "
                "autoreset_mode=SAME_STEP or DISABLED, or SyncVectorEnv, to avoid it."
            )
        return again

    def close(self, **kwargs: Any) -> None:
        """Close the memory (files, connections), then the inner env."""
        self._core.memory.close()
        super().close(**kwargs)

    def _batch(self, env_actions: list[Any]) -> Any:
        if isinstance(self.env.single_action_space, spaces.Text):
            return tuple("" if a is None else a for a in env_actions)
        return np.asarray(env_actions)

    def _step_info(self, info: dict[str, Any], i: int, done: np.ndarray) -> dict[str, Any]:
        """What env ``i``'s own step reported (under SAME_STEP a finished env's step info sits
        in ``final_info``; the top level then holds its reset info)."""
        if self._mode == AutoresetMode.SAME_STEP and done[i]:
            return _info_at(info["final_info"], i)
        return _info_at(info, i)

    def _add_validity(
        self, info: dict[str, Any], parsed: dict[int, Any], replies: dict[int, str],
        live_ids: list[int], done: np.ndarray, rewards: np.ndarray,
    ) -> None:  # fmt: skip
        n = self.num_envs
        core_verdict = self._core.verdict
        valid = np.ones(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        actions: list[Any] = [None] * n
        thoughts: list[str | None] = [None] * n
        for i in live_ids:
            if i in replies:  # a memory action: valid, no env action, no penalty
                continue
            p = parsed[i]
            valid[i], reasons[i] = core_verdict(p, self._step_info(info, i, done))
            actions[i] = p.action
            thoughts[i] = p.thought
        penalty = np.where(valid, 0.0, self._core.parser.invalid_penalty)
        rewards += penalty
        everyone = np.ones(n, dtype=bool)
        for key, value in (
            ("is_action_valid", valid),
            ("invalid_reason", object_array(reasons)),
            ("parsed_action", object_array(actions)),
            ("thought", object_array(thoughts)),
            ("invalid_penalty", penalty),
        ):
            info[key] = value
            info[f"_{key}"] = everyone
        if replies:
            info["memory_reply"] = object_array([replies.get(i) for i in range(n)])
            info["_memory_reply"] = np.array([i in replies for i in range(n)])

    def _add_figures(self, info: dict[str, Any], figures: dict[str, np.ndarray]) -> None:
        everyone = np.ones(self.num_envs, dtype=bool)
        for key, value in figures.items():
            info[key] = value
            info[f"_{key}"] = everyone

    def _add_handover(self, info: dict[str, Any], ids: list[int], episodes: list[Any]) -> None:
        if not ids:
            return
        arr = np.empty(self.num_envs, dtype=object)
        mask = np.zeros(self.num_envs, dtype=bool)
        for i, ep in zip(ids, episodes, strict=True):
            arr[i] = ep
            mask[i] = True
        info["episode_history"] = arr
        info["_episode_history"] = mask
