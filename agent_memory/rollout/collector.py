"""The driver: runs ``num_groups x group_size`` episodes on Ray rollout workers.

Loop, one iteration per step:

1. gather the step results of every worker as they arrive (``ray.wait``);
2. record each live env's step; a finished episode becomes a :class:`Trajectory`, and its env
   gets the next waiting episode (or is parked) in one ``reset_envs`` call per worker;
3. call the policy ONCE on the prompts of live envs only — finished envs cost no generation —
   and scatter the responses back to their workers.

Failures (see :mod:`agent_memory.rollout.worker` for what the workers do themselves):

* A worker that dies is restarted by Ray (``rollout.max_restarts``). Its episodes go back to the
  front of the queue and run again from their start (``attempts`` counts starts), so no episode
  is lost or duplicated. When the worker's call marks name the env that took the process down,
  only that episode is charged; it gets ``rollout.max_episode_attempts`` such starts, then it
  finishes with the error. When nobody can tell (a kill from outside), every episode of the
  worker is charged.
* A call that ran past ``rollout.step_timeout_s`` ends its episode with the timeout.
* A worker whose constructor raised is not restarted: on the first start the run fails with the
  worker's own error; later, the worker is dropped and the others take its episodes.
* When no worker is left, :class:`RolloutFailed` is raised — the finished episodes have been
  handed to ``on_episode`` as they finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.protocol import (
    EpisodeAssignment,
    Generation,
    StepResult,
)
from agent_memory.rollout.book import EpisodeBook, RunningEpisode, Slot
from agent_memory.rollout.cluster import init_ray
from agent_memory.rollout.engine import Engine, RolloutFailed, build_policy, episode_specs
from agent_memory.rollout.pool import WorkerSetupError
from agent_memory.rollout.records import policy_inputs, step_record
from agent_memory.rollout.stats import RolloutStats
from agent_memory.rollout.types import EpisodeSpec, Trajectory

__all__ = [
    "Collector",
    "RolloutFailed",
    "RolloutStats",
    "WorkerSetupError",
    "build_policy",
    "episode_specs",
    "init_ray",
]

log = logging.getLogger(__name__)


class Collector(Engine):
    """Runs a job's episodes on Ray workers with a policy.

    Args:
        job: the validated job config.
        policy: a policy instance (default: built from ``job.policy``).
        on_step: called after every iteration with the collector (tests use it to kill workers).
        run_id: names this run's call-mark directories (default: a fresh id).
    """

    def __init__(
        self,
        job: JobConfig,
        policy: Policy | None = None,
        on_step: Callable[[Collector], None] | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(job, policy, on_step, run_id)
        self._answering: Policy = self.policy

    # ------------------------------------------------------------------ public

    def start(self, num_episodes: int | None = None) -> None:
        """Start the workers (sized for ``num_episodes`` at a time: default the job's). They
        stay up across :meth:`collect` calls until :meth:`close`.

        Raises:
            WorkerSetupError: a worker's constructor raised.
        """
        r = self.job.rollout
        self.pool.start(num_episodes or r.num_episodes)
        self.parked = set(self.pool.slots())
        prepare = getattr(self.policy, "prepare", None)  # it answers here, on the driver
        if prepare is not None:
            prepare()

    def collect(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
        policy: Policy | None = None,
    ) -> list[Trajectory]:
        """Run ``specs`` on the started workers (a trainer calls this once per iteration, with
        the weights of that iteration); returns their trajectories in order.

        Args:
            specs: the episodes.
            progress, on_episode: as :meth:`run`.
            policy: answers these episodes instead of the collector's policy (e.g. a greedy
                one for evaluation); it must need no more meta fields than the workers give.

        Raises:
            RolloutFailed: no worker is left while episodes remain.
        """
        if policy is not None and not set(policy.needs) <= set(self.policy.needs):
            raise ValueError(
                f"policy {type(policy).__name__} needs {sorted(policy.needs)} but the workers "
                f"were started for {sorted(self.policy.needs)}"
            )
        answering, self._answering = self._answering, policy or self.policy

        self.book = book = self._new_book(specs, progress, on_episode)
        steps0 = self.stats.env_steps
        t_loop = time.perf_counter()
        try:
            self._fill([])  # parked slots take the first episodes
            while book.running:
                self._iteration(book)
                if self.on_step is not None:
                    self.on_step(self)
            self._check_done(book)
        finally:
            self._answering = answering
            self.stats.loop_time += time.perf_counter() - t_loop
            self.stats.episodes_rerun += book.reruns
            self.last_env_steps = self.stats.env_steps - steps0
        return book.trajectories()

    def close(self) -> None:
        """Close the workers' envs and memories and end them."""
        self.pool.shutdown()

    # ------------------------------------------------------------------ one step

    def _iteration(self, book: EpisodeBook) -> None:
        live = sorted(book.running)
        runs = [book.running[s] for s in live]
        generations = self._answering.generate(*policy_inputs(runs))
        self.stats.policy_calls += 1
        self.stats.policy_requests += len(runs)
        if len(generations) != len(live):
            raise RuntimeError(
                f"policy {type(self._answering).__name__} returned {len(generations)} responses "
                f"for {len(live)} prompts: expected one response per prompt"
            )
        by_worker: dict[int, dict[int, Generation]] = {}
        for (w, i), gen in zip(live, generations, strict=True):
            by_worker.setdefault(w, {})[i] = gen
        workers = self.pool.workers
        results, failed = self.pool.gather(
            {
                w: workers[w].step.remote({i: g.text for i, g in gens.items()})
                for w, gens in by_worker.items()
            }
        )
        freed: list[Slot] = []
        for w, error in failed.items():
            freed += self._recover(w, error)
        for w, out in results.items():
            for res in out:
                slot = (w, res.env)
                self._record(book.running[slot], by_worker[w][res.env], res)
                if res.done:
                    book.finish(slot, won=res.won, error=res.error, final_prompt=res.next.prompt)
                    freed.append(slot)
                else:
                    book.running[slot].view = res.next
        self._fill(freed)

    def _record(self, run: RunningEpisode, gen: Generation, res: StepResult) -> None:
        run.steps.append(step_record(run, gen, res, self.job.rollout.max_response_chars))
        self.stats.env_steps += 1

    def _recover(self, w: int, error: str) -> list[Slot]:
        """Worker ``w`` failed: the pool settles its episodes; its slots are no longer parked."""
        assert self.book is not None
        self.parked -= set(self.pool.slots(w)) | {(w, i) for i in range(self.pool.envs_per_worker)}
        return self.pool.recover(w, error, self.book)

    def _fill(self, slots: Sequence[Slot]) -> None:
        """Give each free slot the next waiting episode, or park it: one call per worker.

        Slots come back for another round when their worker died meanwhile (after its restart)
        or their env failed to reset (that episode is recorded with the error)."""
        book = self.book
        assert book is not None
        while slots or (book.waiting and self.parked):
            if book.waiting:  # re-runs of a dead worker's episodes wake parked slots
                slots = [*slots, *sorted(self.parked)]
                self.parked.clear()
            plan: dict[int, list[EpisodeAssignment]] = {}
            park: dict[int, list[int]] = {}
            for slot in dict.fromkeys(slots):
                w, i = slot
                if not self.pool.alive[w]:
                    continue
                run = book.start(slot)
                if run is None:
                    park.setdefault(w, []).append(i)
                    self.parked.add(slot)
                    continue
                s = run.spec
                plan.setdefault(w, []).append(EpisodeAssignment(i, s.traj_uid, s.group_uid, s.seed))
            calls = {
                w: self.pool.workers[w].reset_envs.remote(plan.get(w, []), park.get(w, []))
                for w in sorted(set(plan) | set(park))
            }
            results, failed = self.pool.gather(calls)
            slots = []
            for w, error in failed.items():
                slots += self._recover(w, error)
            for w, out in results.items():
                for res in out:
                    slot = (w, res.env)
                    if res.error is not None:  # the env could not even reset
                        book.finish(slot, error=res.error)
                        slots.append(slot)
                    else:
                        book.running[slot].view = res.view
