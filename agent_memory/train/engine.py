"""The trainer's view of the rollout engine: start, collect, new weights, close.

:class:`RolloutEngine` runs the :class:`~agent_memory.rollout.driver.collector.Collector` with the
trainer's policy, whose service gets the weights after every update; evaluation is a greedy
collect. Episode ids are iteration-unique (``it3-g0-t1``), so per-step sampling draws never depend
on which worker slot or batch an episode lands in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.rollout.driver.collector import Collector
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
        model: the live model whose weights :meth:`update_policy` sends.
        run_id: names the run's worker marks.
    """

    def __init__(
        self, job: JobConfig, policy: Policy, model: Any, run_id: str | None = None
    ) -> None:
        self.policy = policy
        self.model = model
        self.collector = Collector(job, policy=policy, run_id=run_id)

    def start(self, max_episodes: int) -> None:
        """Start the workers (sized for ``max_episodes`` episodes at a time) and the policy
        service, which takes a copy of the model as it is now."""
        self.collector.start(max_episodes)

    def collect(
        self,
        specs: Sequence[EpisodeSpec],
        *,
        evaluate: bool = False,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``specs`` with the sampling policy (or greedily with ``evaluate``)."""
        return self.collector.collect(specs, on_episode=on_episode, greedy=evaluate)

    def update_policy(self, version: int) -> float:
        """Send the model's current weights to the policy service as ``version``: they answer
        every episode collected from now on. Returns the seconds the sync took."""
        t0 = time.perf_counter()
        self.policy.version = version
        if self.collector.service is not None:
            weights = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            self.collector.update_policy(weights, version)
        return time.perf_counter() - t0

    def policy_calls(self) -> int:
        """The policy's calls so far (its sampling stream's position, kept by checkpoints)."""
        if self.collector.service is None:
            return self.policy.calls
        import ray

        return int(ray.get(self.collector.service.policy_calls.remote()))

    def close(self) -> None:
        """End the workers and the policy service."""
        self.collector.close()
