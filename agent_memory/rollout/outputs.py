"""The rows of the outputs and the run's summary (the advantages come from
:func:`~agent_memory.rollout.advantages.compute_advantages`).

One row per step: group uid, trajectory uid, step, prompt, response (capped at
``rollout.max_response_chars``, with its full length in ``response_chars``), parsed action,
validity, reward, terminated, truncated, context tokens, advantage and return (plus seed, state
key, invalid reason, won, error, attempts). The ``return`` column is the episode return for GRPO,
the discounted return-to-go ``G_t`` for GiGPO, and GAE's ``A + V`` for PPO. The files are written
by :class:`~agent_memory.rollout.writer.RolloutWriter`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agent_memory.config import JobConfig
from agent_memory.rollout.types import Trajectory

__all__ = ["spread", "step_rows", "summarize"]


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
                    "min_p": None if sampling is None else sampling.min_p,
                    "repetition_penalty": None if sampling is None else sampling.repetition_penalty,
                    "presence_penalty": None if sampling is None else sampling.presence_penalty,
                    "frequency_penalty": None if sampling is None else sampling.frequency_penalty,
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


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, 95th percentile (numpy's linear interpolation) and max of ``values`` (all 0 when
    there are none).

    Example:
        >>> spread([10, 60, 100])
        {'mean': 56.666666666666664, 'p95': 96.0, 'max': 100}
    """
    if not values:
        return {"mean": 0.0, "p95": 0.0, "max": 0}
    return {
        "mean": float(np.mean(values)),
        "p95": float(np.percentile(values, 95)),
        "max": max(values),
    }


def summarize(trajs: Sequence[Trajectory], stats: Any, job: JobConfig) -> dict[str, Any]:
    """The figures of a rollout's finished trajectories (summary.json).

    Context length per episode: ``episode_prompt_tokens`` is the mean, p95 and max over
    episodes of each episode's prompt tokens summed over its steps (what a policy reads in the
    episode), ``episode_peak_prompt_tokens`` the same of each episode's largest prompt; an
    episode with no step is left out. ``mean_prompt_tokens`` / ``max_prompt_tokens`` are per
    step.
    """
    steps = [s for t in trajs for s in t.steps]
    per_episode = [[int(s.context_tokens) for s in t.steps] for t in trajs if t.steps]
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
        "episode_prompt_tokens": spread([sum(e) for e in per_episode]),
        "episode_peak_prompt_tokens": spread([max(e) for e in per_episode]),
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
