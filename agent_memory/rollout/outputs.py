"""Advantages over finished trajectories, the rows of the outputs, and the run's summary.

One row per step: group uid, trajectory uid, step, prompt, response (capped at
``rollout.max_response_chars``, with its full length in ``response_chars``), parsed action,
validity, reward, terminated, truncated, context tokens, advantage and return (plus seed, state
key, invalid reason, won, error, attempts). The ``return`` column is the episode return for GRPO,
the discounted return-to-go ``G_t`` for GiGPO, and GAE's ``A + V`` for PPO. The files are written
by :class:`~agent_memory.rollout.writer.RolloutWriter`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent_memory.config import AlgoConfig, JobConfig
from agent_memory.rollout.advantages import discounted_returns, gae, gigpo, grpo
from agent_memory.rollout.types import Trajectory

__all__ = ["TrajectoryValues", "compute_advantages", "load_value_fn", "step_rows", "summarize"]

ValueFn = Callable[[Sequence[Any]], Sequence[float]]


def load_value_fn(spec: str) -> ValueFn:
    """``"zero"`` (V = 0: GAE becomes discounted returns) or ``"module:function"``, a function
    taking a list of prompts and returning one value per prompt.

    Raises:
        ValueError: a spec of another form, or a name that does not resolve to a callable.
    """
    if spec == "zero":
        return lambda prompts: [0.0] * len(prompts)
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(
            f"algo.value_fn must be 'zero' or 'module:function', got {spec!r}: pass e.g. "
            "algo.value_fn=my_pkg.critic:values"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"algo.value_fn={spec!r} does not resolve: {e}") from e
    if not callable(fn):
        raise ValueError(f"algo.value_fn={spec!r} is not callable")
    return fn


@dataclass(frozen=True)
class TrajectoryValues:
    """A critic's values for one trajectory (PPO's GAE), given to :func:`compute_advantages`.

    Attributes:
        steps: ``V(s_0) .. V(s_{T-1})``, one per step.
        final: ``V(s_T)`` of the state after the last step (used only when the episode did not
            terminate: GAE bootstraps a truncated episode).
    """

    steps: Sequence[float]
    final: float = 0.0


def compute_advantages(
    trajs: Sequence[Trajectory], algo: AlgoConfig,
    values: Mapping[str, TrajectoryValues] | None = None,
) -> None:  # fmt: skip
    """Fill every step's ``advantage`` and ``ret`` for ``algo`` (in place).

    Args:
        trajs: finished trajectories.
        algo: the estimator and its parameters.
        values: PPO only: the values per trajectory (by ``traj_uid``), e.g. from a trainer's
            value head; without them ``algo.value_fn`` computes them from the prompts.

    Raises:
        ValueError: ``values`` misses a trajectory or has the wrong number of steps.
    """
    trajs = [t for t in trajs if t.steps]
    if not trajs:
        return
    rewards = [np.array([s.reward for s in t.steps], dtype=np.float64) for t in trajs]
    groups = [t.spec.group_uid for t in trajs]
    if algo.name == "grpo":
        advs = grpo(rewards, groups, normalize_std=algo.normalize_std, eps=algo.epsilon)
        rets = [np.full(len(r), r.sum()) for r in rewards]
    elif algo.name == "gigpo":
        keys = [[anchor(t, s) for s in t.steps] for t in trajs]
        advs = gigpo(
            rewards, groups, keys, gamma=algo.gamma, step_weight=algo.step_weight,
            normalize_std=algo.normalize_std, eps=algo.epsilon,
        )  # fmt: skip
        rets = [discounted_returns(r, algo.gamma) for r in rewards]
    elif values is not None:
        advs, rets = [], []
        for t, r in zip(trajs, rewards, strict=True):
            given = values.get(t.spec.traj_uid)
            if given is None or len(given.steps) != len(r):
                raise ValueError(
                    f"values for trajectory {t.spec.traj_uid}: expected {len(r)} step values, "
                    f"got {None if given is None else len(given.steps)}"
                )
            a, ret = gae(
                r, np.asarray(given.steps, dtype=np.float64), terminated=t.terminated,
                final_value=float(given.final), gamma=algo.gamma, lam=algo.lam,
            )  # fmt: skip
            advs.append(a)
            rets.append(ret)
    else:
        value_fn = load_value_fn(algo.value_fn)
        prompts = [s.prompt for t in trajs for s in t.steps]
        values = np.asarray(value_fn(prompts), dtype=np.float64)
        if values.shape != (len(prompts),):
            raise ValueError(
                f"algo.value_fn returned {values.shape} values for {len(prompts)} prompts"
            )
        bootstrap = [t for t in trajs if not t.terminated]
        finals = dict(
            zip(
                (id(t) for t in bootstrap),
                value_fn([t.final_prompt for t in bootstrap]) if bootstrap else [],
                strict=True,
            )
        )
        advs, rets, start = [], [], 0
        for t, r in zip(trajs, rewards, strict=True):
            v = values[start : start + len(r)]
            start += len(r)
            a, ret = gae(
                r, v, terminated=t.terminated, final_value=float(finals.get(id(t), 0.0)),
                gamma=algo.gamma, lam=algo.lam,
            )  # fmt: skip
            advs.append(a)
            rets.append(ret)
    for t, a, ret in zip(trajs, advs, rets, strict=True):
        for s, av, rv in zip(t.steps, a, ret, strict=True):
            s.advantage = float(av)
            s.ret = float(rv)


def anchor(t: Trajectory, s: Any) -> Any:
    """GiGPO's step-group key of step ``s``: the env's ``state_key``; for envs without one, the
    raw observation the action was taken on (verl-agent's anchor); else the step alone."""
    if s.state_key is not None:
        return ("state", s.state_key)
    if s.observation is not None:
        return ("observation", s.observation)
    return ("step", t.spec.traj_uid, s.step)


def step_rows(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """One dict per step (the JSONL/Parquet rows; see :data:`ROW_SCHEMA`)."""
    rows = []
    for t in trajs:
        for s in t.steps:
            g = s.generation
            ids = None if g is None else g.response_ids
            sampling = None if g is None else g.sampling
            choice = None if g is None else g.choice
            rows.append(
                {
                    "group_uid": t.spec.group_uid,
                    "traj_uid": t.spec.traj_uid,
                    "seed": t.spec.seed,
                    "step": s.step,
                    "prompt": s.prompt,
                    "response": s.response,
                    "response_chars": s.response_chars,
                    "parsed_action": s.parsed_action,
                    "is_action_valid": s.valid,
                    "invalid_reason": s.invalid_reason,
                    "reward": s.reward,
                    "terminated": s.terminated,
                    "truncated": s.truncated,
                    "context_tokens": s.context_tokens,
                    "context_chars": s.context_chars,
                    "history_steps": s.history_steps,
                    "state_key": s.state_key,
                    "advantage": s.advantage,
                    "return": s.ret,
                    "won": t.won,
                    "error": t.error,
                    "attempts": t.attempts,
                    "thought": s.thought,
                    "prompt_ids": None if g is None else g.prompt_ids,
                    "response_ids": ids,
                    "response_logprobs": None if g is None else g.response_logprobs,
                    "response_mask": None if ids is None else [1] * len(ids),
                    "finish_reason": None if g is None else g.finish_reason,
                    "policy_version": None if g is None else g.policy_version,
                    "temperature": None if sampling is None else sampling.temperature,
                    "top_p": None if sampling is None else sampling.top_p,
                    "top_k": None if sampling is None else sampling.top_k,
                    "sampling_seed": None if sampling is None else sampling.seed,
                    "action_candidates": None
                    if choice is None
                    else [list(c) for c in choice.candidate_ids],
                    "action_index": None if choice is None else choice.index,
                    "action_logprob": None if choice is None else choice.logprob,
                }
            )
    return rows


#: Episode errors listed in the summary at most (all are counted; each is in its rows too).
MAX_LISTED_ERRORS = 20


def summarize(trajs: Sequence[Trajectory], stats: Any, job: JobConfig) -> dict[str, Any]:
    """The figures of a rollout's finished trajectories (summary.json)."""
    steps = [s for t in trajs for s in t.steps]
    tokens = [s.context_tokens for s in steps]
    rewards = [s.reward for s in steps]
    finite = [r for r in rewards if math.isfinite(r)]
    returns = [t.episode_return for t in trajs]
    n = len(trajs)
    errors = [t for t in trajs if t.error is not None]
    return {
        "env": job.env.id,
        "memory": job.memory.strategy,
        "history_length": job.history_length,
        "policy": job.policy.name,
        "algo": job.algo.name,
        "episodes": n,
        "episodes_planned": job.rollout.num_episodes,
        "groups": job.rollout.num_groups,
        "group_size": job.rollout.group_size,
        "success_rate": sum(t.won for t in trajs) / n if n else 0.0,
        "mean_return": float(np.mean([r for r in returns if math.isfinite(r)] or [0.0])),
        "mean_length": float(np.mean([len(t.steps) for t in trajs])) if n else 0.0,
        "terminated": sum(t.terminated for t in trajs),
        "truncated": sum(t.truncated for t in trajs),
        "errors": len(errors),
        "env_steps": len(steps),
        "valid_action_ratio": sum(s.valid for s in steps) / len(steps) if steps else 0.0,
        "nonfinite_rewards": len(rewards) - len(finite),
        "mean_prompt_tokens": float(np.mean(tokens)) if tokens else 0.0,
        "max_prompt_tokens": int(max(tokens)) if tokens else 0,
        "env_steps_per_second": len(steps) / stats.loop_time if stats.loop_time else 0.0,
        "setup_seconds": stats.setup_time,
        "loop_seconds": stats.loop_time,
        "policy_calls": stats.policy_calls,
        "worker_restarts": stats.worker_restarts,
        "workers_lost": stats.workers_lost,
        "episodes_rerun": stats.episodes_rerun,
        "step_timeouts": stats.step_timeouts,
        "worker_failures": list(stats.failures),
        "episode_errors": [
            {
                "traj_uid": t.spec.traj_uid,
                "steps": len(t.steps),
                "attempts": t.attempts,
                "error": t.error,
            }
            for t in errors[:MAX_LISTED_ERRORS]
        ],
    }
