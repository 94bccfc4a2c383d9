"""``VectorHistoryWrapper``: a Gymnasium vector-env wrapper that owns each sub-env's history."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Never

import numpy as np
from gymnasium import spaces
from gymnasium.logger import warn
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.protocol import EPISODE_HISTORY, WON, Episode
from agent_memory.tokens import TokenCounterSpec
from agent_memory.wrappers.base import FIGURES, OwnsHistory
from agent_memory.wrappers.flow import Plan, Verdicts, nones
from agent_memory.wrappers.hold import SubEnvHolds
from agent_memory.wrappers.options import TemplateSpec
from agent_memory.wrappers.prompt import PromptText
from agent_memory.wrappers.subset import SyncSubset
from agent_memory.wrappers.vector_env import (
    STEP_KEYS,
    async_worker_keeps_autoreset,
    autoreset_mode_of,
    infos_at,
    refuse_text_on_shared_memory,
)

__all__ = ["VectorHistoryWrapper"]


@dataclass
class _Outcome:
    """What the inner env's step gave, with the held envs' reward and ends zeroed."""

    texts: dict[int, str]  # each acting env's observation as text, by env id
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]

    def __post_init__(self) -> None:
        self.done = self.terminated | self.truncated


class VectorHistoryWrapper(OwnsHistory, VectorWrapper):
    """Owns one interaction history per sub-env: stores each step, renders each env's prompt.

    ``step(responses)`` parses each response, steps the inner env, stores each acting env's step
    and returns one prompt per env. Episodes end as the inner env's ``autoreset_mode`` says
    (DISABLED: ``reset(options={"reset_mask": m})`` restarts the masked envs) and are handed over
    in ``info["episode_history"]``. ``info`` also gets, per env, ``raw_obs``, the figures and,
    with a parser, the verdicts (``is_action_valid``, ``invalid_reason``, ...). The settings
    are keywords (documented and checked in :class:`~agent_memory.wrappers.HistoryOptions`;
    each one given is kept, also at its default value).

    Args:
        env: any ``gymnasium.vector.VectorEnv`` (Async needs ``shared_memory=False`` for text).

    Example:
        >>> import gymnasium as gym
        >>> import agent_memory.envs  # registers the bundled text envs
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
        >>> env.current(1).task == info["task"][1]
        True
        >>> env.close()
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        history_length: int = 3,
        memory: BaseMemory | None = None,
        formatter: FormatterSpec = "simple",
        template: TemplateSpec = None,
        parser: ActionParser | None = None,
        token_counter: TokenCounterSpec = "estimate",
        max_history_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
        bounded: bool = False,
        obs_to_text: Callable[[Any], str] | None = None,
        **unknown: Never,  # none is accepted: caught to name the setting meant
    ) -> None:
        super().__init__(env)
        self._mode = autoreset_mode_of(env)
        self._async = isinstance(env.unwrapped, AsyncVectorEnv)
        refuse_text_on_shared_memory(env)
        self._setup(self.num_envs, locals(), unknown)
        self.single_observation_space = PromptText()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        if self.parser is not None:
            self.single_action_space = PromptText()
            self.action_space = batch_space(self.single_action_space, self.num_envs)
        n = self.num_envs
        # Envs whose next step is the inner env's autoreset (NEXT_STEP); finished envs that
        # wait for a masked reset (DISABLED), and those of them whose sub-env has not been
        # reset since (the inner env refuses to step them, even held).
        self._pending_reset = np.zeros(n, dtype=bool)
        self._finished = np.zeros(n, dtype=bool)
        self._inner_done = np.zeros(n, dtype=bool)
        self._holds = SubEnvHolds(env)
        self._warned_async = False
        # A SyncVectorEnv with DISABLED autoreset and text spaces: only the envs that act (or
        # reset) are called, so a step's cost follows them, not the batch.
        self._subset = SyncSubset(env) if SyncSubset.fits(env) else None

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The inner env's autoreset mode."""
        return self._mode

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Reset all envs, or only those in ``options["reset_mask"]``; start their histories."""
        mask = None
        if options is not None:
            options = dict(options)  # the inner env pops reset_mask: keep the caller's dict intact
            if "reset_mask" in options:
                mask = self._check_mask(options["reset_mask"], "options['reset_mask']")
        ids = list(range(self.num_envs)) if mask is None else np.flatnonzero(mask).tolist()
        recorder = self._parts.recorder
        gone, handed = recorder.abandon(ids)
        again = self._reset_again_on_next_step(ids)
        self._holds.release(mask)  # only the envs that reset: a held env stays held
        obs, info = self._reset_inner(ids, mask, seed, options)
        texts = [recorder.obs_to_text(obs[i]) for i in ids]
        recorder.start(ids, texts, infos_at(info, ids))
        self._pending_reset[ids] = False
        self._pending_reset[again] = True
        self._finished[ids] = False
        self._inner_done[ids] = False
        # Only the envs that reset get new prompts (the others keep theirs): a masked reset
        # of one env among many costs no pass over the others' histories.
        self._build(ids)
        self._report(info, np.ones(self.num_envs, dtype=bool), gone, handed)
        return self.prompts, info

    def step(
        self,
        actions: Sequence[Any],
        extras: Mapping[str, Sequence[Any]] | None = None,
        *,
        mask: Sequence[bool] | np.ndarray | None = None,
    ) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the envs with the model's responses (one per env) and return the new prompts.

        Args:
            actions: one response (or env action, without a parser) per env; ignored for envs
                that are finished, resetting or held.
            extras: more per-env values to store with this step (e.g. ``{"logprob": [...]}``).
            mask: which envs act (None: all). The others are held: not stepped (each sub-env
                wrapped in :class:`~agent_memory.wrappers.Holdable`), nothing stored, reward 0,
                prompt unchanged, ``_key`` masks False. Needs ``autoreset_mode`` DISABLED.
                Over a ``SyncVectorEnv`` with text spaces, only the acting sub-envs are called
                (:class:`~agent_memory.wrappers.subset.SyncSubset`): the step costs what they
                do, whatever the number of envs.

        Raises:
            ValueError: ``actions``, ``extras`` or ``mask`` of the wrong length or type, a
                partial mask without DISABLED, or sub-envs that cannot be held.
            RuntimeError: a finished env acts before its reset (DISABLED).
        """
        acting, ids = self._acting(actions, extras, mask)
        # Envs whose step is the inner env's autoreset (NEXT_STEP only): they store nothing.
        restarted: list[int] = []
        if self._mode == AutoresetMode.NEXT_STEP:
            restarted = np.flatnonzero(self._pending_reset & acting).tolist()
        skip = set(restarted)
        live_ids = [i for i in ids if i not in skip] if skip else ids
        flow = self._parts.flow
        plan = flow.plan(actions, live_ids)
        if self._subset is not None:
            out = self._step_subset(plan, ids)
        else:
            out = self._step_inner(actions, plan, acting, mask is not None)
        # Store, verdict and penalty for every env that really stepped (see flow.py).
        step_infos = self._step_infos(out.info, live_ids, out.done)
        verdicts = flow.record(plan, step_infos, out.rewards, extras)
        if verdicts is not None:
            self._add_verdicts(out.info, verdicts, acting)
        ended = [i for i in live_ids if out.done[i]]
        handed = self._move_episodes_on(out, step_infos, live_ids, ended, restarted)
        self._build(ids)
        self._report(out.info, acting, ended, handed)
        return self.prompts, out.rewards, out.terminated, out.truncated, out.info

    def close(self, **kwargs: Any) -> None:
        """Close the memory (files, connections), then the inner env."""
        self._close_memory()
        super().close(**kwargs)

    def _check_mask(self, mask: Any, name: str) -> np.ndarray:
        arr = np.array(mask, copy=True)
        if arr.shape != (self.num_envs,) or arr.dtype != np.bool_:
            raise ValueError(
                f"{name} must be a bool array of shape ({self.num_envs},), "
                f"got dtype {arr.dtype} shape {arr.shape}"
            )
        return arr

    def _step_mask(self, mask: Any) -> np.ndarray:
        acting = self._check_mask(mask, "mask")
        if not acting.all() and self._mode != AutoresetMode.DISABLED:
            raise ValueError(
                f"step(mask=...) holds env(s) {np.flatnonzero(~acting).tolist()} back, but the "
                f"inner env's autoreset_mode is {self._mode.name}: it steps (or autoresets) every "
                "sub-env on every step, so a held env's episode would move on unseen; build the "
                "vector env with autoreset_mode=AutoresetMode.DISABLED (e.g. "
                "agent_memory.wrappers.make_vec_holdable(env_id, n)) to step some envs only"
            )
        return acting

    def _acting(
        self,
        actions: Sequence[Any],
        extras: Mapping[str, Sequence[Any]] | None,
        mask: Sequence[bool] | np.ndarray | None,
    ) -> tuple[np.ndarray, list[int]]:
        """Check ``step``'s arguments; the envs that act (all without a ``mask``), as a mask
        and as ids."""
        n = self.num_envs
        if isinstance(actions, (str, bytes)) or len(actions) != n:
            got = type(actions).__name__ if isinstance(actions, (str, bytes)) else len(actions)
            raise ValueError(f"expected {n} actions (one per env), got {got}")
        for key, values in (extras or {}).items():
            if isinstance(values, (str, bytes)) or len(values) != n:
                raise ValueError(f"extras[{key!r}] must hold {n} values (one per env)")
        acting = np.ones(n, dtype=bool) if mask is None else self._step_mask(mask)
        ids = np.flatnonzero(acting)
        if self._mode == AutoresetMode.DISABLED and self._finished[ids].any():
            raise RuntimeError(
                f"env(s) {np.flatnonzero(self._finished & acting).tolist()} finished their "
                "episode and autoreset_mode is DISABLED: call reset(options={'reset_mask': "
                "mask}) for them before stepping (or leave them out of step's mask)"
            )
        return acting, ids.tolist()

    def _step_inner(
        self, actions: Sequence[Any], plan: Plan, acting: np.ndarray, masked: bool
    ) -> _Outcome:
        """Hold the envs that do not act, step the inner env, and zero what held envs report
        (in new arrays: the penalty must not touch the env's own buffers)."""
        parser = self._parts.options.parser
        # The envs that do not act get the fallback (with a parser, else what was given).
        env_actions = (
            list(actions) if parser is None else [parser.fallback_action()] * self.num_envs
        )
        for i, a in plan.env_actions.items():
            env_actions[i] = a
        if masked or self._holds.flags.any():
            self._inner_done[self._holds.set(~acting, self._inner_done)] = False
        obs, rewards, terminated, truncated, info = self.env.step(self._batch(env_actions))
        to_text = self._parts.recorder.obs_to_text
        return _Outcome(
            texts={i: to_text(obs[i]) for i in np.flatnonzero(acting).tolist()},
            rewards=np.where(acting, np.asarray(rewards, dtype=np.float64), 0.0),
            terminated=np.logical_and(terminated, acting),
            truncated=np.logical_and(truncated, acting),
            info=info,
        )

    def _step_subset(self, plan: Plan, ids: list[int]) -> _Outcome:
        """:meth:`_step_inner` calling only the acting sub-envs (:class:`SyncSubset`): the
        same outcome, at the cost of the envs that act."""
        assert self._subset is not None
        # The others are flagged held, as the full step does, and never called (a finished
        # one needs no reset behind the scenes).
        self._holds.hold_all_but(ids)
        env_actions = plan.env_actions  # every acting env's: none resets on a step (DISABLED)
        batch = [env_actions[i] for i in ids]
        obs, rewards, terminated, truncated, info = self._subset.step(ids, batch)
        to_text = self._parts.recorder.obs_to_text
        return _Outcome(
            {i: to_text(o) for i, o in obs.items()}, rewards, terminated, truncated, info
        )

    def _reset_inner(
        self, ids: list[int], mask: np.ndarray | None, seed: Any, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        """The inner env's reset of ``ids`` (all, or the masked ones): its observations (indexed
        by env id) and info."""
        if (
            self._subset is not None
            and mask is not None
            and ids
            and options is not None
            and isinstance(options["reset_mask"], np.ndarray)  # what SyncVectorEnv accepts
        ):
            rest = {k: v for k, v in options.items() if k != "reset_mask"}
            return self._subset.reset(ids, seed, rest)
        # Sync and Async take one seed per env too (VectorEnv.reset is annotated with an int).
        return self.env.reset(seed=seed, options=options)

    def _move_episodes_on(
        self,
        out: _Outcome,
        step_infos: Mapping[int, Mapping[str, Any]],
        live_ids: list[int],
        ended: list[int],
        restarted: list[int],
    ) -> list[Episode]:
        """Observe the envs that go on; end, hand over and restart the others, as the
        autoreset mode says (``restarted``: the envs the inner env reset on this step, under
        NEXT_STEP). Returns the episodes handed over (one per env of ``ended``)."""
        recorder, texts, info, done = self._parts.recorder, out.texts, out.info, out.done
        going = [i for i in live_ids if not done[i]]
        recorder.observe(going, [texts[i] for i in going], [step_infos[i] for i in going])
        if self._mode == AutoresetMode.NEXT_STEP:
            # This step reset the envs that ended last step; those ending now reset next step.
            recorder.start(restarted, [texts[i] for i in restarted], infos_at(info, restarted))
            self._pending_reset = out.done.copy()
            finals = [texts[i] for i in ended]
        elif self._mode == AutoresetMode.SAME_STEP:
            # The env already reset: the last observation is in final_obs, texts[i] starts anew.
            finals = [recorder.obs_to_text(info["final_obs"][i]) for i in ended]
        else:  # DISABLED: the envs wait, finished, for a masked reset
            finals = [texts[i] for i in ended]
            self._finished[ended] = True
            self._inner_done[ended] = True
        won = [bool(step_infos[i].get(WON, False)) for i in ended]
        handed = recorder.handover(ended, finals, out.terminated[ended], out.truncated[ended], won)
        if self._mode == AutoresetMode.SAME_STEP:
            recorder.start(ended, [texts[i] for i in ended], infos_at(info, ended))
        elif ended:  # the final observation is what the env shows until it resets
            recorder.observe(ended, finals, [{} for _ in ended])
        return handed

    def _reset_again_on_next_step(self, ids: list[int]) -> list[int]:
        """Envs of ``ids`` that Gymnasium's AsyncVectorEnv will reset again on the next step.

        Gymnasium 1.4 bug: with ``shared_memory=False`` an env that finished before a manual
        reset is reset again on the next step; that step is then treated as its reset step.
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

    def _batch(self, env_actions: list[Any]) -> Any:
        if isinstance(self.env.single_action_space, spaces.Text):
            return tuple("" if a is None else a for a in env_actions)
        return np.asarray(env_actions)

    def _step_infos(
        self, info: dict[str, Any], ids: list[int], done: np.ndarray
    ) -> dict[int, dict[str, Any]]:
        """What each env of ``ids``'s own step reported (under SAME_STEP a finished env's step
        info sits in ``final_info``; the top level then holds its reset info)."""
        if self._mode != AutoresetMode.SAME_STEP:
            return dict(zip(ids, infos_at(info, ids, STEP_KEYS), strict=True))
        finals = [i for i in ids if done[i]]
        going = [i for i in ids if not done[i]]
        final = infos_at(info["final_info"], finals, STEP_KEYS) if finals else []
        return dict(zip(finals + going, final + infos_at(info, going, STEP_KEYS), strict=True))

    def _add_verdicts(self, info: dict[str, Any], verdicts: Verdicts, acting: np.ndarray) -> None:
        for key, values in verdicts.items():
            info[key] = values
            info[f"_{key}"] = acting.copy()
        for key, by_env in (
            ("memory_reply", verdicts.replies),
            ("memory_flag", verdicts.flags),
            ("memory_note_tokens", verdicts.note_tokens),
        ):
            if by_env:
                self._put_some(info, key, by_env)

    def _put_some(self, info: dict[str, Any], key: str, by_env: Mapping[int, Any]) -> None:
        """``info[key]``: the values of the envs in ``by_env`` (None elsewhere), with its mask."""
        values, present = nones(self.num_envs), np.zeros(self.num_envs, dtype=bool)
        for i, value in by_env.items():
            values[i] = value
            present[i] = True
        info[key], info[f"_{key}"] = values, present

    def _report(
        self, info: dict[str, Any], acting: np.ndarray, ended: list[int], episodes: list[Episode]
    ) -> None:
        """Put the figures, the observation texts and the handed-over episodes in ``info``."""
        for key in FIGURES:
            info[key] = self._figures[key].copy()
            info[f"_{key}"] = acting.copy()
        info["raw_obs"] = self._parts.recorder.state.observations()
        info["_raw_obs"] = acting.copy()
        if ended:
            self._put_some(info, EPISODE_HISTORY, dict(zip(ended, episodes, strict=True)))
