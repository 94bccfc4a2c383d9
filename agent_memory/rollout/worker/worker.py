"""``RolloutWorker``: one Ray actor owning one wrapped vector env that holds many sub-envs.

The driver decides which episode each sub-env plays and when; the worker executes: ``reset_envs``
starts episodes (partial resets, each with its group's seed), ``step`` applies responses,
:meth:`RolloutWorker.run` plays on its own. Failures stay as small as they can
(docs/failures.md); the constructor never raises: :meth:`RolloutWorker.status` reports its error,
so a deterministic set-up failure is not restarted ``max_restarts`` times.
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_memory.config import JobConfig
from agent_memory.failures import describe_exception
from agent_memory.memory import make_memory
from agent_memory.rollout.messages import (
    EpisodeAssignment,
    EpisodeBatch,
    PromptView,
    ResetResult,
    StepResult,
    WorkerStatus,
)
from agent_memory.rollout.worker.episode_loop import EpisodeLoop
from agent_memory.rollout.worker.port import PolicyPort, PolicySource, make_port
from agent_memory.rollout.worker.watchdog import CallMarks, CallWatchdog, MarkCalls, kill_processes
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import Holdable, VectorHistoryWrapper
from agent_memory.wrappers.errors import CatchErrors
from agent_memory.wrappers.vector_env import env_value, env_values

__all__ = ["RolloutWorker", "build_env", "marks_dir"]


def marks_dir(run_id: str, worker: int) -> str:
    """Where worker ``worker`` of run ``run_id`` keeps its call marks (on its own machine)."""
    return os.path.join(tempfile.gettempdir(), f"agent_memory-{run_id}", f"worker-{worker}")


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
    """The wrapped vector env a worker runs: ``num_envs`` sub-envs of ``job.env``, DISABLED
    autoreset, history per ``job.memory``; with ``marks``, every env call is marked there."""
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
    mem = job.memory
    counter = make_token_counter(mem.token_counter)
    memory = make_memory(
        mem.strategy,
        num_envs=num_envs,
        formatter=job.env.formatter,
        token_counter=counter,
        max_tokens=mem.max_tokens,
        capacity=job.memory_capacity,
        **dict(mem.params),
    )
    return VectorHistoryWrapper(
        venv,
        history_length=job.history_length,
        memory=memory,
        template=job.env.template.build(),
        parser=job.env.parser.build(),
        token_counter=counter,
        max_prompt_tokens=mem.max_prompt_tokens,
    )


class RolloutWorker:
    """Runs the episodes the driver assigns on ``num_envs`` sub-envs (used as a Ray actor).

    Args:
        index: this worker's number (for reports).
        num_envs: sub-envs in this worker's vector env.
        meta_fields: per-env fields the policy needs besides the prompt (``Policy.needs``).
        marks_root: directory of this worker's call marks; None: no marks, no step time limit.
        policy: what the worker answers with: a policy it runs, or a policy service's Ray
            handle (None: until :meth:`set_policy`); made a port once
            (:func:`~agent_memory.rollout.worker.port.make_port`).
        freeze_envs: the process is the worker's own (a Ray actor): once built, its envs are
            left out of the garbage collector's passes (``gc.freeze``; +16% env-steps/s at
            16k envs a worker, ``scripts/bench_scale.py``). Not in a process shared with other
            code, whose objects it would freeze too.
    """

    def __init__(
        self,
        index: int,
        job: JobConfig,
        num_envs: int,
        meta_fields: Sequence[str] | None = None,
        marks_root: str | None = None,
        policy: PolicySource | None = None,
        freeze_envs: bool = False,
    ) -> None:
        self.index = index
        self.job = job
        self.port: PolicyPort | None = None
        self.num_envs = num_envs
        self.meta_fields = set(meta_fields or [])
        self.marks = None if marks_root is None else CallMarks(marks_root, num_envs)
        # What the previous process of this worker left unfinished (if it died in an env).
        self.crashes = () if self.marks is None else self.marks.collect()
        self.watchdog: CallWatchdog | None = None
        self.init_error: str | None = None
        self.live = np.zeros(num_envs, dtype=bool)
        # The asynchronous engine's running loops by stream, and what came for a stream before
        # it started (assignments, or None: finish).
        self.loops: dict[int, EpisodeLoop] = {}
        self.early: dict[int, list[list[EpisodeAssignment] | None]] = {}
        self.state_keys: list[str | None] = [None] * num_envs
        self.views: list[PromptView | None] = [None] * num_envs
        try:
            # No env is reset until it gets an episode, and only envs with a response step:
            # an env with nothing to play does no work (no game loaded, no sandbox).
            self.env = build_env(job, num_envs, self.marks)
            if freeze_envs:
                # The envs live as long as the process: out of the garbage collector's full
                # passes, which would walk every env's objects again and again.
                gc.collect()
                gc.freeze()
            if policy is not None:
                self.port = make_port(policy, lockstep=job.rollout.mode == "lockstep")
                self.port.prepare()  # the first step pays no client set-up
        except Exception as e:  # reported by status(): a set-up error is not worth a restart
            self.init_error = describe_exception(e)
            return
        limit = job.rollout.step_timeout_s
        if limit is not None and self.marks is not None:
            inner = self.env.unwrapped
            procs = list(inner.processes) if isinstance(inner, AsyncVectorEnv) else []
            self.watchdog = CallWatchdog(self.marks, limit, partial(kill_processes, procs))

    def status(self) -> WorkerStatus:
        """The worker's process, its set-up error if any, and what its predecessor left."""
        import ray

        crashes, self.crashes = self.crashes, ()
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return WorkerStatus(os.getpid(), self.init_error, crashes, node)

    def set_policy(self, policy: PolicySource) -> WorkerStatus:
        """Answer with ``policy`` from now on (as the constructor's ``policy``); returns
        :meth:`status`. The pool sends it after the constructor and after each restart: a
        restartable actor's constructor argument must not live in Ray's object store."""
        self.port = make_port(policy, lockstep=self.job.rollout.mode == "lockstep")
        if self.init_error is None:
            try:
                self.port.prepare()
            except Exception as e:  # reported by status(), as the constructor's errors
                self.init_error = describe_exception(e)
        return self.status()

    def pid(self) -> int:
        """The worker's process id (tests kill it to check recovery)."""
        return os.getpid()

    def reset_envs(
        self, assignments: Sequence[EpisodeAssignment], park: Sequence[int] = ()
    ) -> list[ResetResult]:
        """Start the assigned episodes; the envs in ``park`` have nothing to play (untouched
        until they get an episode). Returns each assigned env's first prompt, or the error its
        reset raised (every assignment's, when the reset call itself fails)."""
        self._check_ready()
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
        """Apply the responses of the envs in ``responses`` (live ones); every other env is held
        (not stepped, nothing stored). Reports, per stepped env, the step's outcome and the next
        prompt (and the memory's turn, when it asks for one before the next action). The
        responses of the envs in ``turns`` answer their memory's turn: they go to the memory, the
        env is not stepped. A finished env needs ``reset_envs`` (a new episode) before its next
        step."""
        self._check_ready()
        unknown = [i for i in responses if not (0 <= i < self.num_envs and self.live[i])]
        if unknown:
            raise ValueError(f"worker {self.index}: env(s) {unknown} have no running episode")
        answered = sorted(i for i in responses if i in turns)
        out = self._answer_turns(answered, responses) if answered else []
        if len(answered) < len(responses):
            out += self._step_envs(
                responses
                if not answered
                else {i: r for i, r in responses.items() if i not in turns}
            )
        return out

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
        stepped = sorted(responses)
        # Only the stepped envs are touched here (and in the wrapper): a step's cost follows
        # the envs that act, not the worker's num_envs.
        actions: list[Any] = [None] * self.num_envs
        for i in stepped:
            actions[i] = responses[i]
        acting = np.zeros(self.num_envs, dtype=bool)
        acting[stepped] = True
        try:
            prompts, rewards, terminated, truncated, info = self.env.step(actions, mask=acting)
            done = np.logical_or(terminated, truncated)
            # The oracle only for envs that act again: a finished env's next prompt is never
            # answered.
            going = [i for i in stepped if not done[i]]
            views = self._views(stepped, prompts, info, acting=going)
            turns = self._memory_turns(going)
        except Exception as e:
            self._end_process_if_broken()
            return self._failed_step(stepped, describe_exception(e))
        # Each info key's values for the stepped envs, read once per step.
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

    async def run(
        self,
        assignments: Sequence[EpisodeAssignment],
        policy_version: int | None = None,
        stream: int = 0,
    ) -> AsyncIterator[EpisodeBatch]:
        """Play ``assignments`` (and what :meth:`assign` adds) with the worker's policy, yielding
        the ended episodes packed (a Ray streaming call; see :class:`EpisodeLoop`); ends after
        :meth:`finish`, once its episodes have.

        Args:
            assignments: the first episodes to play.
            policy_version: the version the worker's own policy answers with from now on.
            stream: this call's number, which :meth:`assign` and :meth:`finish` name (Ray may
                start an async actor's calls out of order: calls for a later stream wait).
        """
        self._check_ready()
        port = self.port
        if port is None:
            raise RuntimeError(
                f"worker {self.index} has no policy to play with: pass the constructor's "
                "policy or call set_policy before run"
            )
        if policy_version is not None:
            port.set_version(policy_version)
        r = self.job.rollout
        inline = port.inline
        loop = EpisodeLoop(
            self,
            port,
            r.max_response_chars,
            r.report_interval_for(inline),
            lockstep=r.mode == "lockstep",
            pass_window_s=r.pass_window_s,
            spare_report_interval_s=r.report_interval_for(inline, spare=True),
        )
        self.loops[stream] = loop
        for early in self.early.pop(stream, []):
            self._to_stream(stream, early)
        try:
            async for ended in loop.run(assignments):
                yield EpisodeBatch.pack(ended)
        finally:
            self.loops.pop(stream, None)

    async def assign(self, assignments: Sequence[EpisodeAssignment], stream: int = 0) -> None:
        """More episodes for the running :meth:`run` call ``stream``."""
        self._to_stream(stream, list(assignments))

    async def drain(self, stream: int = 0) -> None:
        """Nothing more waits at the driver for :meth:`run` call ``stream`` (a hint about when
        to report: see :meth:`EpisodeLoop.drain`); ignored for a stream not running."""
        loop = self.loops.get(stream)
        if loop is not None:
            loop.drain()

    async def finish(self, stream: int = 0) -> None:
        """No more episodes for :meth:`run` call ``stream``: it ends once its episodes have."""
        self._to_stream(stream, None)

    async def set_concurrency(self, concurrency: int) -> None:
        """The worker's share of its client policy's requests in flight (see
        :mod:`agent_memory.rollout.driver.shares`); ignored by a policy without one."""
        if self.port is not None:
            self.port.set_concurrency(concurrency)

    def policy_stats(self) -> Any:
        """The counters of the policy this worker runs (e.g. the openai client's requests and
        retries) since the last call, or None for a policy without counters (or not run here).
        """
        return None if self.port is None else self.port.take_stats()

    def close(self) -> None:
        """Close the envs and the memory; remove the call marks."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.init_error is None:
            self.env.close()
        if self.marks is not None:
            self.marks.close(remove=True)

    def _to_stream(self, stream: int, assignments: list[EpisodeAssignment] | None) -> None:
        """More episodes (None: finish) for :meth:`run` call ``stream``, kept until it starts."""
        loop = self.loops.get(stream)
        if loop is None:
            self.early.setdefault(stream, []).append(assignments)
        elif assignments is None:
            loop.finish()
        else:
            loop.assign(assignments)

    def _check_ready(self) -> None:
        if self.init_error is not None:
            raise RuntimeError(f"worker {self.index} could not start:\n{self.init_error}")

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
        """An async vector env whose sub-env process died cannot step again: end this worker
        process (its call marks name the env) so that Ray starts a fresh one."""
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
        # The figures of ``ids`` only (not every env's).
        tokens, chars, steps = (
            dict(zip(ids, info[key][ids].tolist(), strict=True))
            for key in ("context_tokens", "context_chars", "history_steps")
        )
        views = {}
        for i in ids:
            now = self.env.current(i)
            meta: dict[str, Any] = {}
            if "admissible_actions" in self.meta_fields:
                actions = now.admissible_actions
                meta["admissible_actions"] = None if actions is None else list(actions)
            if "task" in self.meta_fields:
                meta["task"] = now.task  # as the prompt shows it
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
