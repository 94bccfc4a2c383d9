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

from agent_memory.protocol import Generation, ScoreRule
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
        loss_mask: ``generate`` mode: per response token, 1 where it is trained (None: all).
        score: ``score`` mode: how each candidate's score was made from its token log-probs.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    old_logprobs: list[float]
    advantage: float
    ret: float
    temperature: float
    candidates: tuple[tuple[int, ...], ...] | None = None
    index: int | None = None
    loss_mask: tuple[int, ...] | None = None
    score: ScoreRule = "sum"

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
    train_memory_tokens: bool = True,
    blocks: bool = True,
) -> list[Sample]:
    """The samples of every step of ``trajs`` (in order) whose advantage is known.

    Args:
        trajs: finished trajectories with advantages computed.
        mode: the action mode the rollout policy used.
        keep_forced: keep ``score`` steps with a single admissible action (for a value head).
        min_version: leave out steps answered by older weights (the others of their episode
            stay).
        train_memory_tokens: False leaves the tokens that wrote the memory's block (the rows'
            ``memory_mask``) out of the loss; in ``score`` mode, the memory's choices (else one
            more sample per step that chose a block, with the step's advantage); and the memory
            turns (e.g. policy-written summaries).
        blocks: the memory takes blocks from the responses (``memory=notes``): leaving them out
            needs each step's ``memory_mask``.

    Raises:
        ValueError: a step without the recorded ids and log-probs the mode needs, or without a
            ``memory_mask`` when ``train_memory_tokens`` is False.
    """
    out = []
    for t in trajs:
        for s in t.steps:
            if s.advantage is None or s.ret is None or is_stale(s, min_version):
                continue
            if s.memory_turn and not train_memory_tokens:  # the ablation: memory turns left out
                continue
            where = f"trajectory {t.spec.traj_uid} step {s.step}"
            if mode == "score":
                out += _choice_samples(s, where, keep_forced, train_memory_tokens)
            else:
                out.append(_token_sample(s, where, train_memory_tokens or not blocks))
    return out


def _generation(step: StepRecord, where: str) -> Generation:
    """``step``'s generation, with the token ids the trainer learns from."""
    g = step.generation
    if g is None or not g.has_tokens:
        raise ValueError(
            f"{where} has no recorded token ids: the trainer learns from what the policy "
            "sampled (policy=score or policy=hf record them)"
        )
    return g


def _choice_samples(
    step: StepRecord, where: str, keep_forced: bool, train_memory_tokens: bool
) -> list[Sample]:
    """``score`` mode: the action's choice (unless forced) and the memory block's choice."""
    g = _generation(step, where)
    if g.choice is None:
        raise ValueError(f"{where} was not chosen by scoring (no Generation.choice)")
    assert g.prompt_ids is not None and step.advantage is not None and step.ret is not None
    p, adv, ret = tuple(g.prompt_ids), step.advantage, step.ret
    out = []
    a = g.choice
    if len(a.candidate_ids) > 1 or keep_forced:  # a forced action carries no gradient
        out.append(
            Sample(
                p,
                tuple(g.response_ids or ()),
                [a.logprob],
                adv,
                ret,
                a.temperature,
                a.candidate_ids,
                a.index,
                score=a.score,
            )
        )
    m = g.memory_choice  # a choice of its own, also where the action was forced
    if m is not None and train_memory_tokens and len(m.candidate_ids) > 1:
        out.append(
            Sample(
                p,
                m.candidate_ids[m.index],
                [m.logprob],
                adv,
                ret,
                m.temperature,
                m.candidate_ids,
                m.index,
                score=m.score,
            )
        )
    return out


def _token_sample(step: StepRecord, where: str, train_memory_tokens: bool) -> Sample:
    """``generate`` mode: the response's tokens (without the memory's, when not trained)."""
    g = _generation(step, where)
    if g.response_logprobs is None or not g.response_ids:
        raise ValueError(f"{where} has no sampling log-probs to compute a ratio with")
    assert g.prompt_ids is not None and step.advantage is not None and step.ret is not None
    loss_mask = None
    if not train_memory_tokens:
        if step.memory_mask is None:
            raise ValueError(
                f"{where} has no memory_mask: trainer.train_memory_tokens=false needs "
                "memory=notes and a policy that reports token offsets (hf, or openai with "
                "return_tokens and policy.params.tokenizer)"
            )
        loss_mask = tuple(1 - m for m in step.memory_mask)
    temperature = (
        1.0 if g.sampling is None or g.sampling.temperature is None else (g.sampling.temperature)
    )
    return Sample(
        tuple(g.prompt_ids),
        tuple(g.response_ids),
        list(g.response_logprobs),
        step.advantage,
        step.ret,
        temperature,
        loss_mask=loss_mask,
    )
