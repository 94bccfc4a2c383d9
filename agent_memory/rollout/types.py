"""What a rollout produces: episode specs, per-step records and trajectories."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_memory.pickling import by_position
from agent_memory.protocol import Generation

__all__ = ["EpisodeBatch", "EpisodeSpec", "FinishedEpisode", "StepRecord", "Trajectory"]


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run. Members of a group share ``seed``: they start from the same state."""

    group_uid: str
    traj_uid: str
    group_index: int
    member: int
    seed: int


@by_position
@dataclass
class StepRecord:
    """One step of a trajectory: the prompt the policy saw, what it produced (its text and, for
    policies that sample tokens, the token ids and log-probs), and what came of it."""

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
    #: The observation the action was taken on, without history or template (GiGPO groups steps
    #: of envs that give no ``state_key`` by it, as verl-agent groups by its anchor).
    observation: str | None = None
    #: The thought the parser found (``<think>...</think>``), else None.
    thought: str | None = None
    #: The policy's :class:`~agent_memory.protocol.Generation` (token ids, log-probs, finish
    #: reason, version, sampling), or None for steps recorded without one.
    generation: Generation | None = None
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
    """Worker -> driver (asynchronous engine): the episodes that ended since the worker's last
        message, pickled once by the worker with the C pickler (Ray's cloudpickle costs the process
        that steps the envs about twice the time); Ray then ships one bytes object.

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
        episodes: list[FinishedEpisode] = pickle.loads(self.payload)
        return episodes
