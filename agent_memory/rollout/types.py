"""What a rollout produces: episode specs, per-step records and trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_memory.pickling import by_position
from agent_memory.protocol import Generation

__all__ = ["EpisodeSpec", "StepRecord", "Trajectory"]


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
    #: The memory's flag for this step (``info["memory_flag"]``, e.g. ``memory=notes``'s
    #: ``"missing"`` / ``"malformed"`` / ``"cut"``), else None.
    memory_flag: str | None = None
    #: The tokens of the note the memory keeps after this step (``info["memory_note_tokens"]``,
    #: ``memory=notes``: what the next prompt shows of it, at most ``note_tokens``), else None.
    memory_note_tokens: int | None = None
    #: Per response token, 1 where it writes the memory's block (``memory=notes``), else 0;
    #: None when the memory reads no block or the policy reports no token offsets.
    memory_mask: list[int] | None = None
    #: A memory turn (e.g. ``summarizer=policy``'s summary), not an env step: the policy
    #: answered its memory's prompt; reward 0, trained with the next action's advantage.
    memory_turn: bool = False
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
        """The episode was cut off without ending (a last step both terminated and truncated
        counts once, as terminated: GAE does not bootstrap it)."""
        return bool(self.steps) and bool(self.steps[-1].truncated) and not self.terminated
