"""What a rollout produces: episode specs, per-step records and trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EpisodeSpec", "StepRecord", "Trajectory"]


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run. Members of a group share ``seed``: they start from the same state."""

    group_uid: str
    traj_uid: str
    group_index: int
    member: int
    seed: int


@dataclass
class StepRecord:
    """One step of a trajectory: the prompt the policy saw and what came of its response."""

    step: int
    prompt: Any
    #: The raw response, capped at ``rollout.max_response_chars`` (a non-string as its repr).
    response: str
    parsed_action: Any
    valid: bool
    invalid_reason: str | None
    reward: float
    terminated: bool
    truncated: bool
    context_tokens: int
    context_chars: int
    history_steps: int
    state_key: str | None
    #: The raw response's full length in characters (before the cap).
    response_chars: int = 0
    #: None until the advantages of the episode's group are computed.
    advantage: float | None = None
    ret: float | None = None


@dataclass
class Trajectory:
    """A finished episode."""

    spec: EpisodeSpec
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    error: str | None = None
    final_prompt: Any = None
    worker: int = -1
    attempts: int = 1

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def terminated(self) -> bool:
        """The episode ended (its last step terminated)."""
        return bool(self.steps) and bool(self.steps[-1].terminated)

    @property
    def truncated(self) -> bool:
        """The episode was cut off without ending. A last step that is both terminated and
        truncated (the time limit struck on the final step) counts once, as terminated: GAE
        does not bootstrap it and summaries do not count it twice."""
        return bool(self.steps) and bool(self.steps[-1].truncated) and not self.terminated
