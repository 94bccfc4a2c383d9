"""``Groups``: finished episodes wait for their group; a complete group gets its advantages.

GRPO and GiGPO normalise within a group, so a group's advantages exist once its last member has
finished. The driver computes them here and hands the group on (to the writer); members of groups
still incomplete when a run stops are handed on at the end, their advantages null.

Example:
    >>> from agent_memory.config import AlgoConfig
    >>> from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
    >>> def traj(member, reward):
    ...     step = StepRecord(1, "p", "r", "a", True, None, reward, True, False, 1, 1, 0, None)
    ...     return Trajectory(EpisodeSpec("g0", f"g0-t{member}", 0, member, 7), [step])
    >>> done = []
    >>> groups = Groups(2, AlgoConfig(name="grpo"), on_group=done.append)
    >>> groups.add(traj(0, 1.0)); done
    []
    >>> groups.add(traj(1, 0.0)); [[t.steps[0].advantage for t in g] for g in done]
    [[0.707..., -0.707...]]
"""

from __future__ import annotations

from collections.abc import Callable

from agent_memory.config import AlgoConfig
from agent_memory.rollout.driver.advantages import compute_advantages
from agent_memory.rollout.types import Trajectory

__all__ = ["Groups"]


class Groups:
    """Holds finished episodes by group (see the module docstring).

    Args:
        group_size: members per group.
        algo: the advantage estimator.
        on_group: called with each complete group, advantages filled, members in finishing order.
    """

    def __init__(
        self, group_size: int, algo: AlgoConfig, on_group: Callable[[list[Trajectory]], None]
    ) -> None:
        self.group_size = group_size
        self.algo = algo
        self.on_group = on_group
        self._open: dict[str, list[Trajectory]] = {}

    def add(self, traj: Trajectory) -> None:
        """A finished episode; its group goes on once complete."""
        group = self._open.setdefault(traj.spec.group_uid, [])
        group.append(traj)
        if len(group) == self.group_size:
            del self._open[traj.spec.group_uid]
            compute_advantages(group, self.algo)
            self.on_group(group)

    def incomplete(self) -> list[list[Trajectory]]:
        """The groups still waiting for members (taken: a second call returns none)."""
        rest, self._open = list(self._open.values()), {}
        return rest
