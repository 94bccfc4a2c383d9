"""The step rows of a rollout's outputs and its summary figures (columns: docs/output-schema.md).

The advantages come from :func:`~agent_memory.rollout.driver.advantages.compute_advantages`; the
files are written by :class:`~agent_memory.rollout.driver.writer.RolloutWriter`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from agent_memory.config import JobConfig
from agent_memory.protocol import Generation
from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = ["spread", "step_rows", "summarize"]


def step_rows(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """One dict per step (the JSONL/Parquet rows; see :data:`ROW_COLUMNS`)."""
    return [_step_row(t, s) for t in trajs for s in t.steps]


def _step_row(t: Trajectory, s: StepRecord) -> dict[str, Any]:
    return {
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
        "memory_flag": s.memory_flag,
        "memory_mask": s.memory_mask,
        "memory_turn": s.memory_turn,
        "memory_note_tokens": s.memory_note_tokens,
        **_generation_columns(s.generation),
    }


#: Row column -> attribute of a step's sampling parameters.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "sampling_seed": "seed",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "tools": "tools",
    "tool_choice": "tool_choice",
}


def _field(obj: Any, name: str) -> Any:
    return None if obj is None else getattr(obj, name)


def _generation_columns(g: Generation | None) -> dict[str, Any]:
    """The token, sampling and action-choice columns (all null for a step without a generation)."""
    ids = _field(g, "response_ids")
    sampling, choice = _field(g, "sampling"), _field(g, "choice")
    memory = _field(g, "memory_choice")
    return {
        "prompt_ids": _field(g, "prompt_ids"),
        "response_ids": ids,
        "response_logprobs": _field(g, "response_logprobs"),
        "response_mask": None if ids is None else [1] * len(ids),
        "finish_reason": _field(g, "finish_reason"),
        "policy_version": _field(g, "policy_version"),
        **{col: _field(sampling, attr) for col, attr in _SAMPLING_FIELDS.items()},
        "action_candidates": None if choice is None else [list(c) for c in choice.candidate_ids],
        "action_index": _field(choice, "index"),
        "action_logprob": _field(choice, "logprob"),
        "action_score": _field(choice, "score"),
        "memory_candidates": None if memory is None else [list(c) for c in memory.candidate_ids],
        "memory_index": _field(memory, "index"),
        "memory_logprob": _field(memory, "logprob"),
        "memory_score": _field(memory, "score"),
    }


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
    p95 = float(np.percentile(values, 95))
    return {"mean": float(np.mean(values)), "p95": p95, "max": max(values)}


def summarize(trajs: Sequence[Trajectory], stats: Any, job: JobConfig) -> dict[str, Any]:
    """The figures of a rollout's finished trajectories (summary.json).

    Fields: docs/output-schema.md. ``prompt_tokens_from`` says what the prompt figures counted:
    ``prompt_ids`` (the policy's tokenizer), ``token_counter`` or ``both``.
    """
    every = [s for t in trajs for s in t.steps]
    steps = [s for s in every if not s.memory_turn]  # the env's steps
    errors = [t for t in trajs if t.error is not None]
    return {
        "env": job.env.id,
        "memory": job.memory.strategy,
        "history_length": job.history_length,
        "policy": job.policy.name,
        "algo": job.algo.name,
        "episodes": len(trajs),
        "episodes_planned": job.rollout.num_episodes,
        "groups": job.rollout.num_groups,
        "group_size": job.rollout.group_size,
        **_outcome_figures(trajs, steps),
        "env_steps_per_second": _ratio(len(steps), stats.loop_time),
        "memory_turns": len(every) - len(steps),
        "token_counter": job.memory.token_counter,
        "prompt_tokens_from": _counted_by(steps),
        "setup_seconds": stats.setup_time,
        "loop_seconds": stats.loop_time,
        "policy_requests": stats.policy_requests,
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


def _outcome_figures(trajs: Sequence[Trajectory], steps: Sequence[StepRecord]) -> dict[str, Any]:
    """The episodes' and steps' figures: outcomes, validity, prompt tokens."""
    returns = [r for r in (t.episode_return for t in trajs) if math.isfinite(r)]
    tokens = [s.context_tokens for s in steps]
    per_episode = [[int(s.context_tokens) for s in t.steps] for t in trajs if t.steps]
    return {
        "success_rate": _ratio(sum(t.won for t in trajs), len(trajs)),
        "mean_return": float(np.mean(returns or [0.0])),
        "mean_length": len(steps) / len(trajs) if trajs else 0.0,
        "terminated": sum(t.terminated for t in trajs),
        "truncated": sum(t.truncated for t in trajs),
        "errors": sum(t.error is not None for t in trajs),
        "env_steps": len(steps),
        "valid_action_ratio": _ratio(sum(s.valid for s in steps), len(steps)),
        "nonfinite_rewards": sum(not math.isfinite(s.reward) for s in steps),
        "memory_flags": _flag_counts(steps),
        "mean_prompt_tokens": _mean(tokens),
        "max_prompt_tokens": int(max(tokens)) if tokens else 0,
        "episode_prompt_tokens": spread([sum(e) for e in per_episode]),
        "episode_peak_prompt_tokens": spread([max(e) for e in per_episode]),
    }


def _counted_by(steps: Sequence[StepRecord]) -> str:
    """What the steps' ``context_tokens`` counted (see :func:`summarize`)."""
    with_ids = {s.generation is not None and s.generation.prompt_ids is not None for s in steps}
    if with_ids == {True}:
        return "prompt_ids"
    return "both" if with_ids == {True, False} else "token_counter"


def _flag_counts(steps: Sequence[StepRecord]) -> dict[str, int]:
    return dict(Counter(s.memory_flag for s in steps if s.memory_flag is not None))


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0
