"""Training samples from finished trajectories: one per step, built from the recorded ids only.

Nothing is re-tokenised: a step without recorded ids is an error. In ``score`` mode a step whose
only admissible action was forced has ``log pi = 0`` whatever the weights: it carries no policy
gradient and is left out unless a value head needs it (``keep_forced``; its term is masked out).

Example:
    >>> from agent_memory.protocol import ActionChoice, Generation
    >>> from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
    >>> gen = Generation("blue", prompt_ids=[5, 6], response_ids=[9, 3],
    ...                  response_logprobs=[-0.1, -0.2],
    ...                  choice=ActionChoice(((8, 3), (9, 3)), index=1, logprob=-0.7))
    >>> step = StepRecord(1, "q", "blue", "blue", True, None, 1.0, True, False, 2, 4, 0, None,
    ...                   generation=gen, advantage=0.5, ret=1.0)
    >>> traj = Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 7), [step])
    >>> [s.old_logprobs for s in build_samples([traj], "score")]
    [[-0.7]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = ["ActionMode", "Sample", "build_samples", "is_stale"]

#: ``generate``: token-by-token responses (``hf``); ``score``: a choice among admissible actions.
ActionMode = Literal["generate", "score"]


@dataclass(frozen=True)
class Sample:
    """One step, as the update sees it.

    Attributes:
        prompt_ids: what the model was conditioned on.
        response_ids: what it produced (the chosen action's ids in ``score`` mode).
        old_logprobs: per response token (``generate``), or ``[log pi(action)]`` (``score``).
        advantage: the step's advantage.
        ret: the step's return (the value target, PPO).
        temperature: the sampling temperature the log-probs are taken at.
        candidates: ``score`` mode: every candidate's ids; else None.
        index: ``score`` mode: the chosen candidate; else None.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    old_logprobs: list[float]
    advantage: float
    ret: float
    temperature: float
    candidates: tuple[tuple[int, ...], ...] | None = None
    index: int | None = None

    @property
    def forced(self) -> bool:
        """A single admissible action (``score`` mode): no choice was made."""
        return self.candidates is not None and len(self.candidates) == 1


def is_stale(step: StepRecord, min_version: int | None) -> bool:
    """Whether ``step`` was answered by weights older than ``min_version``."""
    v = None if step.generation is None else step.generation.policy_version
    return min_version is not None and v is not None and v < min_version


def build_samples(
    trajs: Sequence[Trajectory],
    mode: ActionMode,
    *,
    keep_forced: bool = False,
    min_version: int | None = None,
) -> list[Sample]:
    """The samples of every step of ``trajs`` (in order) whose advantage is known.

    Args:
        trajs: finished trajectories with advantages computed.
        mode: the action mode the rollout policy used.
        keep_forced: keep ``score`` steps with a single admissible action (for a value head).
        min_version: leave out steps answered by older weights (the others of their episode
            stay).

    Raises:
        ValueError: a step without the recorded ids and log-probs the mode needs.
    """
    out = []
    for t in trajs:
        for s in t.steps:
            if s.advantage is None or s.ret is None or is_stale(s, min_version):
                continue
            g = s.generation
            where = f"trajectory {t.spec.traj_uid} step {s.step}"
            if g is None or not g.has_tokens:
                raise ValueError(
                    f"{where} has no recorded token ids: the trainer learns from what the policy "
                    "sampled (policy=score or policy=hf record them)"
                )
            assert g.prompt_ids is not None and g.response_ids is not None
            temperature = 1.0 if g.sampling is None or g.sampling.temperature is None else (
                g.sampling.temperature
            )  # fmt: skip
            if mode == "score":
                if g.choice is None:
                    raise ValueError(f"{where} was not chosen by scoring (no Generation.choice)")
                if len(g.choice.candidate_ids) == 1 and not keep_forced:
                    continue
                out.append(
                    Sample(
                        tuple(g.prompt_ids), tuple(g.response_ids), [g.choice.logprob],
                        s.advantage, s.ret, g.choice.temperature, g.choice.candidate_ids,
                        g.choice.index,
                    )
                )  # fmt: skip
            else:
                if g.response_logprobs is None or not g.response_ids:
                    raise ValueError(f"{where} has no sampling log-probs to compute a ratio with")
                out.append(
                    Sample(
                        tuple(g.prompt_ids), tuple(g.response_ids), list(g.response_logprobs),
                        s.advantage, s.ret, temperature,
                    )
                )  # fmt: skip
    return out
