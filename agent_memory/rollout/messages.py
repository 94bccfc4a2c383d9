"""The messages between the rollout driver and its Ray workers: dataclasses (never plain dicts),
the only things that cross that process boundary.

Driver -> worker: :class:`EpisodeAssignment`. Worker -> driver: :class:`WorkerStatus` (with
:class:`CrashReport`) and :class:`FinishedEpisode` packed in an :class:`EpisodeBatch`.

Example:
    >>> a = EpisodeAssignment(env=3, traj_uid="g0-t1", group_uid="g0", seed=7)
    >>> batch = EpisodeBatch.pack([FinishedEpisode(a.env, a.traj_uid, won=True)])
    >>> [(ep.env, ep.traj_uid, ep.won) for ep in batch.unpack()]
    [(3, 'g0-t1', True)]
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from agent_memory.pickling import by_position
from agent_memory.rollout.types import StepRecord

__all__ = [
    "CrashReport",
    "EpisodeAssignment",
    "EpisodeBatch",
    "FinishedEpisode",
    "WorkerStatus",
]


@dataclass(frozen=True)
class EpisodeAssignment:
    """Driver -> worker: sub-env ``env`` starts episode ``traj_uid`` from ``seed``.

    Members of a group share ``seed``; ``group_uid`` is given to memories that share notes
    within a group. ``order``: the assignment's place among this env's in the current call stream
    (0, 1, 2...): the worker plays them in that order, whatever order Ray delivers them in.
    """

    env: int
    traj_uid: str
    group_uid: str
    seed: int
    order: int = 0


@dataclass(frozen=True)
class CrashReport:
    """What a worker's previous process was doing in an env when it died.

    Attributes:
        env: the sub-env that was inside ``phase`` and never returned.
        phase: ``"reset"`` or ``"step"``.
        reason: ``"died"`` (``os._exit``, a segfault, a kill) or ``"timeout"`` (the watchdog).
        seconds: how long the call had run when the process ended (None when unknown).
        traj_uid: the episode the env was playing (None when unknown); the env index alone
            can name the wrong one (the driver may not have heard its previous episode ended).
    """

    env: int
    phase: Literal["reset", "step"]
    reason: Literal["died", "timeout"]
    seconds: float | None = None
    traj_uid: str | None = None


@dataclass(frozen=True)
class WorkerStatus:
    """A worker's answer to ``status()``: its process, and why it cannot work if it cannot.

    Attributes:
        init_error: the exception its constructor raised (type, message, last frames), or None
            when it is ready; the driver does not restart a worker for it (deterministic).
        crashes: what the worker's previous process was doing when it died (may be empty).
        node: the Ray node it runs on (None outside Ray): the driver asks Ray whether that
            node died when the worker does (a lost node is no env's doing).
    """

    pid: int
    init_error: str | None = None
    crashes: tuple[CrashReport, ...] = ()
    node: str | None = None


@by_position
@dataclass
class FinishedEpisode:
    """Worker -> driver (asynchronous engine): an episode that ended on sub-env ``env``.

    Attributes:
        error: what ended it early (an env failure, or its reset's), if anything did.
        final_prompt: the prompt after its last step.
        requests: the policy requests sent for it (one per step: none after it ended).
    """

    env: int
    traj_uid: str
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    error: str | None = None
    final_prompt: Any = None
    requests: int = 0


@dataclass(frozen=True)
class EpisodeBatch:
    """Worker -> driver: the episodes that ended since the worker's last message, pickled once
    with the C pickler (faster than Ray's cloudpickle in the process that steps the envs).

    Example:
        >>> batch = EpisodeBatch.pack([FinishedEpisode(3, "g0-t1", won=True)])
        >>> [(ep.env, ep.traj_uid, ep.won) for ep in batch.unpack()]
        [(3, 'g0-t1', True)]
    """

    payload: bytes

    @classmethod
    def pack(cls, episodes: Sequence[FinishedEpisode]) -> EpisodeBatch:
        """One message for ``episodes``: the C pickler's, or cloudpickle's when a field holds
        what only cloudpickle writes (e.g. a function, or a class Ray shipped by value)."""
        episodes = list(episodes)
        try:
            return cls(pickle.dumps(episodes, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:
            from ray import cloudpickle

            return cls(cloudpickle.dumps(episodes, protocol=pickle.HIGHEST_PROTOCOL))

    def unpack(self) -> list[FinishedEpisode]:
        """The episodes, in the order they were packed."""
        return cast("list[FinishedEpisode]", pickle.loads(self.payload))
