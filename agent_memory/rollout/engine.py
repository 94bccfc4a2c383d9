"""What both rollout engines share: the job, its policy, the worker pool, and ``run``.

:class:`~agent_memory.rollout.collector.Collector` (lockstep) and
:class:`~agent_memory.rollout.async_collector.AsyncCollector` (asynchronous) differ in how episodes
are played (:meth:`Engine.start`, :meth:`Engine.collect`, :meth:`Engine.close`); a run of a job's
episodes on workers started for them is the same in both (:meth:`Engine.run`).
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy, make_policy
from agent_memory.rollout.book import EpisodeBook, Slot
from agent_memory.rollout.pool import WorkerPool
from agent_memory.rollout.stats import RolloutStats
from agent_memory.rollout.types import EpisodeSpec, Trajectory

__all__ = ["Engine", "RolloutFailed", "build_policy", "episode_specs"]


class RolloutFailed(RuntimeError):
    """The run could not finish its episodes (e.g. every worker died for good)."""


def episode_specs(num_groups: int, group_size: int, seed: int) -> list[EpisodeSpec]:
    """``num_groups x group_size`` episodes; a group's members share the seed ``seed + group``.

    Example:
        >>> [(s.traj_uid, s.seed) for s in episode_specs(2, 2, seed=7)]
        [('g0-t0', 7), ('g0-t1', 7), ('g1-t0', 8), ('g1-t1', 8)]
    """
    return [
        EpisodeSpec(f"g{g}", f"g{g}-t{m}", g, m, seed + g)
        for g in range(num_groups)
        for m in range(group_size)
    ]


class Engine(ABC):
    """A rollout engine (see the module docstring).

    Args:
        job: the validated job config.
        policy: a policy instance (default: built from ``job.policy``).
        on_step: called with the engine after every lockstep iteration / every finished episode
            of the asynchronous engine (tests use it to kill workers).
        run_id: names this run's call-mark directories (default: a fresh id).
    """

    def __init__(
        self,
        job: JobConfig,
        policy: Policy | None = None,
        on_step: Callable[[Any], None] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.job = job
        self.policy = policy or build_policy(job)
        self.on_step = on_step
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.stats = RolloutStats()
        self.pool = WorkerPool(job, self.run_id, self.stats, sorted(self.policy.needs))
        self.book: EpisodeBook | None = None
        #: Slots with nothing to play; they take re-runs when a worker dies.
        self.parked: set[Slot] = set()

    def run(
        self,
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run the job's episodes (``rollout.num_groups x group_size`` from ``rollout.seed``)
        on workers started for them; returns the trajectories in episode order.

        Args:
            progress: called with each finished trajectory (e.g. a progress bar).
            on_episode: called with each finished trajectory before ``progress`` (e.g. the
                output writer, so that a failing run keeps what finished).

        Raises:
            WorkerSetupError: a worker's constructor raised (its own message and frames).
            RolloutFailed: no worker is left while episodes remain.
        """
        r = self.job.rollout
        specs = episode_specs(r.num_groups, r.group_size, r.seed)
        t0 = time.perf_counter()
        try:
            self.start(len(specs))
            self.stats.setup_time = time.perf_counter() - t0
            return self.collect(specs, progress=progress, on_episode=on_episode)
        finally:
            self.stats.wall_time = time.perf_counter() - t0
            self.close()

    @abstractmethod
    def start(self, num_episodes: int | None = None) -> None:
        """Start the workers (and what answers for them); they stay up until :meth:`close`."""

    @abstractmethod
    def collect(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``specs`` on the started workers; their trajectories, in order."""

    @abstractmethod
    def close(self) -> None:
        """End the workers."""

    def _new_book(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None,
        on_episode: Callable[[Trajectory], None] | None,
    ) -> EpisodeBook:
        """The book of a :meth:`collect`: each finished trajectory goes to ``on_episode``,
        then to ``progress``."""

        def finished(traj: Trajectory) -> None:
            if on_episode is not None:
                on_episode(traj)
            if progress is not None:
                progress(traj)

        return EpisodeBook(specs, self.job.rollout.max_episode_attempts, on_finish=finished)

    def _check_done(self, book: EpisodeBook) -> None:
        """Raise :class:`RolloutFailed` when episodes wait but no worker is left to run them."""
        if not book.done:
            raise RolloutFailed(
                "every rollout worker died and none can be restarted "
                f"(rollout.max_restarts={self.job.rollout.max_restarts}); "
                f"{len(book.finished)} of {len(book.specs)} episodes finished. Last failure: "
                f"{self.stats.failures[-1] if self.stats.failures else '?'}"
            )

    def worker_pid(self, w: int) -> int:
        """Process id of worker ``w``."""
        return self.pool.pid(w)


def build_policy(job: JobConfig) -> Policy:
    """The job's policy, with the env's parser (so scripted/random answers parse); defaults for
    ``random`` (the env's ``random_actions``, the rollout seed) and ``prompt_oracle`` (env id)."""
    params = dict(job.policy.params)
    if job.policy.name == "random":
        params.setdefault("actions", list(job.env.random_actions))
        params.setdefault("seed", job.rollout.seed)
    if job.policy.name == "prompt_oracle":
        params.setdefault("env_id", job.env.id)
    return make_policy(job.policy.name, parser=job.env.parser.build(), **params)
