"""What the trainer reports of the memory, and the evaluation episodes' rows it can write.

The memory's own counters, per episode, for the training and the evaluation episodes
(``train/memory_*`` and ``eval/memory_*`` columns of ``metrics.csv``): the tokens the policy
wrote into its memory (``memory=notes``' blocks: the chosen block's ids with ``policy=score``,
the ``<memory>`` tokens of a generated response), its memory turns (``summarizer=policy``) and
the share of env steps the memory flagged (``missing``, ``malformed``, ``cut``: the rollout
summary's ``memory_flags``) and the length of the note it keeps (``memory=notes``: its tokens
after each step, what the next prompt shows; mean and max over the steps). With
``trainer.eval_rows=true`` every evaluation's episodes are written as a rollout writes them, to
``eval/iter_NNNNNN/`` (docs/output-schema.md).

Example:
    >>> memory_metrics([], "eval")
    {}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.rollout.driver.outputs import summarize
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.driver.writer import RolloutWriter
from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = [
    "MEMORY_FLAGS",
    "add_memory_totals",
    "eval_rows_dir",
    "memory_metrics",
    "memory_tokens",
    "note_lengths",
    "write_eval_rows",
]

#: The flags a memory raises for a step (``StepRecord.memory_flag``; ``memory=notes``'s): each
#: has a column, the share of env steps it was raised for.
MEMORY_FLAGS = ("missing", "malformed", "cut", "bad_call", "unknown_call", "old_not_found")


def memory_tokens(step: StepRecord) -> int:
    """The tokens ``step``'s response wrote into the memory: the chosen memory block's ids
    (a choosing policy), else the response tokens its memory mask marks (0 when neither).

    Example:
        >>> from agent_memory.rollout.types import StepRecord
        >>> s = StepRecord(1, "p", "r", "a", True, None, 0.0, False, False, 1, 1, 0, None)
        >>> s.memory_mask = [1, 1, 0]
        >>> memory_tokens(s)
        2
    """
    choice = None if step.generation is None else step.generation.memory_choice
    if choice is not None:
        return len(choice.candidate_ids[choice.index])
    return sum(step.memory_mask or ())


def note_lengths(trajs: Sequence[Trajectory]) -> list[int]:
    """The note's tokens after each step of ``trajs`` that has one (``memory=notes``; none for
    a memory without a note).

    Example:
        >>> from agent_memory.rollout.types import EpisodeSpec, StepRecord
        >>> s = StepRecord(1, "p", "r", "a", True, None, 0.0, False, False, 1, 1, 0, None)
        >>> t = Trajectory(EpisodeSpec("g", "g-t0", 0, 0, 0), [s, s])
        >>> s.memory_note_tokens = 5
        >>> note_lengths([t])
        [5, 5]
    """
    return [n for t in trajs for s in t.steps if (n := s.memory_note_tokens) is not None]


def memory_metrics(trajs: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    """The memory's counters over ``trajs`` as ``metrics.csv`` columns under ``prefix``: its
    tokens and turns per episode, each flag's share of the env steps, and the note's mean and
    max tokens over the steps (left out for a memory without a note: no length to show)."""
    if not trajs:
        return {}
    every = [s for t in trajs for s in t.steps]
    steps = [s for s in every if not s.memory_turn]
    flags = Counter(s.memory_flag for s in steps if s.memory_flag is not None)
    n = len(trajs)
    out = {
        f"{prefix}/memory_tokens_per_episode": sum(memory_tokens(s) for s in every) / n,
        f"{prefix}/memory_turns_per_episode": (len(every) - len(steps)) / n,
    }
    for flag in MEMORY_FLAGS:
        out[f"{prefix}/memory_flag_{flag}"] = flags[flag] / max(1, len(steps))
    if lengths := note_lengths(trajs):
        out[f"{prefix}/memory_note_tokens_mean"] = sum(lengths) / len(lengths)
        out[f"{prefix}/memory_note_tokens_max"] = float(max(lengths))
    return out


def add_memory_totals(totals: dict[str, Any], trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """``totals`` (``summary.json``'s ``memory_tokens``, ``memory_turns`` and ``memory_flags``,
    over every training episode so far; with a note, ``memory_note_steps``, the steps whose
    note was measured, and the note's ``memory_note_tokens_mean`` and ``_max`` over them) with
    ``trajs``'s added; returns it.

    Example:
        >>> add_memory_totals({}, [])
        {'memory_tokens': 0, 'memory_turns': 0, 'memory_flags': {}}
    """
    every = [s for t in trajs for s in t.steps]
    flags = Counter(totals.get("memory_flags", {}))
    flags.update(s.memory_flag for s in every if s.memory_flag is not None and not s.memory_turn)
    totals["memory_tokens"] = totals.get("memory_tokens", 0) + sum(memory_tokens(s) for s in every)
    totals["memory_turns"] = totals.get("memory_turns", 0) + sum(s.memory_turn for s in every)
    totals["memory_flags"] = dict(flags)
    if lengths := note_lengths(trajs):
        before = totals.get("memory_note_steps", 0)
        steps = before + len(lengths)
        mean = totals.get("memory_note_tokens_mean", 0.0)
        totals["memory_note_steps"] = steps
        totals["memory_note_tokens_mean"] = (mean * before + sum(lengths)) / steps
        totals["memory_note_tokens_max"] = max(totals.get("memory_note_tokens_max", 0), *lengths)
    return totals


def eval_rows_dir(out: str | Path, iteration: int) -> Path:
    """Where the evaluation after ``iteration`` iterations (0: before training) writes its rows.

    Example:
        >>> eval_rows_dir("run", 20).as_posix()
        'run/eval/iter_000020'
    """
    return Path(out) / "eval" / f"iter_{iteration:06d}"


def write_eval_rows(
    out: str | Path,
    iteration: int,
    trajs: Sequence[Trajectory],
    job: JobConfig,
    seconds: float,
    labels: Mapping[str, Any],
) -> Path:
    """Write an evaluation's episodes as the rollout's writer writes a run's
    (``trajectories.jsonl``, ``errors.jsonl``, ``summary.json``; advantages null: evaluation
    trains on nothing) to :func:`eval_rows_dir`; returns that directory."""
    target = eval_rows_dir(out, iteration)
    writer = RolloutWriter(target, job)
    for traj in sorted(trajs, key=lambda t: t.spec.seed):  # one group per held-out seed
        writer.add_group([traj])
    n = len(trajs)
    stats = RolloutStats(env_steps=sum(not s.memory_turn for t in trajs for s in t.steps))
    stats.loop_time = seconds
    summary = {"status": "ok", **summarize(trajs, stats, job)}
    summary.update(episodes_planned=n, groups=n, group_size=1, greedy=True, **labels)
    writer.close(summary)
    return target
