"""The trainer's view of the rollout engine: start, collect, new weights, close.

:class:`RolloutEngine` wraps the lockstep :class:`~agent_memory.rollout.collector.Collector`
(Ray workers stay up for the whole run; the policy runs in this process, once per step for every
live env). :meth:`RolloutEngine.update_policy` is the single place where the trainer tells the
engine "new weights, version v": with the in-process lockstep policy, which holds the trainer's
live model, the weights are already there and only the version is bumped, before any episode of
the next iteration starts. An asynchronous engine (policy actors, a serving process) broadcasts
the weights here instead, and its staleness bound (``rollout.max_policy_lag``) decides whether
episodes may span versions.

Episodes get iteration-unique ids (``it3-g0-t1``), so the ``score`` policy's per-step sampling
draws never depend on which worker slot or batch position an episode lands in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.rollout.collector import Collector
from agent_memory.rollout.types import EpisodeSpec, Trajectory

__all__ = ["RolloutEngine", "eval_specs", "train_specs"]


def train_specs(iteration: int, num_groups: int, group_size: int, seed: int) -> list[EpisodeSpec]:
    """Iteration ``iteration``'s episodes: group ``g`` starts from ``seed + iteration *
    num_groups + g`` (every group of the run a fresh start state).

    Example:
        >>> [(s.traj_uid, s.seed) for s in train_specs(1, 2, 2, seed=0)]
        [('it1-g0-t0', 2), ('it1-g0-t1', 2), ('it1-g1-t0', 3), ('it1-g1-t1', 3)]
    """
    first = seed + iteration * num_groups
    return [
        EpisodeSpec(f"it{iteration}-g{g}", f"it{iteration}-g{g}-t{m}", g, m, first + g)
        for g in range(num_groups)
        for m in range(group_size)
    ]


def eval_specs(num_episodes: int, seed: int, tag: str = "eval") -> list[EpisodeSpec]:
    """The held-out evaluation episodes: one per seed ``seed .. seed + num_episodes - 1``.

    Example:
        >>> [(s.traj_uid, s.seed) for s in eval_specs(2, seed=100)]
        [('eval-e0', 100), ('eval-e1', 101)]
    """
    return [EpisodeSpec(f"{tag}-e{j}", f"{tag}-e{j}", j, 0, seed + j) for j in range(num_episodes)]


class RolloutEngine:
    """Start / collect / update_policy / close over the rollout workers (module docstring).

    Args:
        job: the validated job (env, memory, rollout).
        policy: the sampling policy (holding the trainer's live model).
        eval_policy: the greedy policy evaluation answers with (the same live model).
        run_id: names the run's worker marks.
    """

    def __init__(
        self, job: JobConfig, policy: Policy, eval_policy: Policy, run_id: str | None = None
    ) -> None:
        self.policy = policy
        self.eval_policy = eval_policy
        self.collector = Collector(job, policy=policy, run_id=run_id)
        self.num_episodes = job.rollout.num_episodes

    def start(self, max_episodes: int) -> None:
        """Start the workers, sized for ``max_episodes`` episodes at a time."""
        self.collector.start(max_episodes)

    def collect(
        self, specs: Sequence[EpisodeSpec], *, evaluate: bool = False,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:  # fmt: skip
        """Play ``specs`` with the sampling policy (or greedily with ``evaluate``)."""
        return self.collector.collect(
            specs, on_episode=on_episode, policy=self.eval_policy if evaluate else None
        )

    @property
    def last_env_steps(self) -> int:
        """Env-steps of the last :meth:`collect`."""
        return int(getattr(self.collector, "last_env_steps", 0))

    def update_policy(self, version: int) -> float:
        """New weights, version ``version``: every episode collected from now on is answered by
        them. Returns the seconds the sync took."""
        t0 = time.perf_counter()
        # Lockstep, in-process: the policies hold the live model; only the version is news.
        self.policy.version = version
        self.eval_policy.version = version
        return time.perf_counter() - t0

    def close(self) -> None:
        """End the workers."""
        self.collector.close()
