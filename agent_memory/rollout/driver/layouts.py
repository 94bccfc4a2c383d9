"""How rollouts become training samples: ``rollout.layout`` (docs/output-schema.md).

``step``: every step is a sample (the step rows). ``episode``: an episode's turns as one token
sequence while each turn's prompt extends the previous turn's prompt and response (the *prefix
property*, checked token by token); a turn whose prompt does not (the memory rewrote it) starts
another segment, one sample each (:func:`episode_samples`). Where the job's chat only grows, a
break is a bug, not a rewrite: ``strict`` raises :class:`PrefixBroken`.

Example:
    >>> from agent_memory.protocol import Generation
    >>> from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
    >>> def step(k, prompt, response):
    ...     g = Generation("", prompt_ids=prompt, response_ids=response,
    ...                    response_logprobs=[-0.5] * len(response))
    ...     return StepRecord(k, "", "", None, True, None, 1.0, k == 3, False, len(prompt), 0, 0,
    ...                       None, generation=g)
    >>> t = Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 7), [step(1, [1, 2], [3, 9]),
    ...                step(2, [1, 2, 3, 9, 4], [5, 9]), step(3, [1, 6], [5])], won=True)
    >>> [(s.prompt_ids, s.completion_ids, s.completion_mask, s.first_turn)
    ...  for s in episode_samples(t, strict=False)]
    [([1, 2], [3, 9, 4, 5, 9], [1, 1, 0, 1, 1], 1), ([1, 6], [5], [1], 3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_memory.protocol import Generation
from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = [
    "LAYOUTS",
    "LAYOUT_FIX",
    "EpisodeSample",
    "LayoutError",
    "PrefixBroken",
    "episode_samples",
    "memory_tokens",
]

LAYOUTS: tuple[str, ...] = ("step", "episode")


class LayoutError(ValueError):
    """Steps that cannot make an episode sample (e.g. recorded without token ids)."""


class PrefixBroken(LayoutError):
    """A turn's prompt is not the previous turn's prompt and response followed by new tokens."""


@dataclass(frozen=True)
class EpisodeSample:
    """One trainable sample per episode segment (the ``episode`` layout), with the columns of
    :data:`~agent_memory.rollout.driver.writer.EPISODE_COLUMNS` as :meth:`row` gives them."""

    group_uid: str
    traj_uid: str
    segment: int
    segments: int
    first_turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    memory_mask: list[int] | None
    token_advantages: list[float] | None
    advantage: float | None
    episode_return: float
    won: bool
    turns: int
    policy_versions: list[int | None]

    def row(self) -> dict[str, Any]:
        """The sample as a JSON/Arrow row (field names as above)."""
        return dict(self.__dict__)


#: What :class:`PrefixBroken` tells a ``rollout.layout=episode`` run to do.
LAYOUT_FIX = (
    "render it incrementally (policy.params.incremental=true) with a chat template that does "
    "not re-render earlier turns, or use rollout.layout=step"
)


def episode_samples(
    traj: Trajectory, *, strict: bool = True, blocks: bool = True, fix: str = LAYOUT_FIX
) -> list[EpisodeSample]:
    """``traj`` as one sample per segment (see the module docstring).

    Args:
        strict: its chat only grows, so it must be one segment (a break raises).
        blocks: the memory may take blocks from the responses (``memory=notes``), so a turn
            without a ``memory_mask`` leaves its sample's unknown (None); False: only memory
            turns write the memory, and other turns' tokens are 0 in it.
        fix: what :class:`PrefixBroken` tells the caller to do (the layout's own advice).

    Raises:
        LayoutError: a step without token ids, or an episode without steps.
        PrefixBroken: with ``strict``, a turn whose prompt does not extend the previous turn's.
    """
    uid = traj.spec.traj_uid
    if not traj.steps:
        raise LayoutError(f"episode {uid} has no steps ({traj.error or 'it never started'})")
    gens = [_tokens_of(s, uid) for s in traj.steps]
    starts = [0] + [k for k in range(1, len(gens)) if _breaks(uid, k, gens, strict, fix)]
    samples = []
    for segment, (a, b) in enumerate(zip(starts, [*starts[1:], len(gens)], strict=True)):
        prompt, completion, mask, logprobs, memory, advantages = _stitch(
            traj.steps[a:b], gens[a:b], blocks
        )
        samples.append(
            EpisodeSample(
                group_uid=traj.spec.group_uid,
                traj_uid=uid,
                segment=segment,
                segments=len(starts),
                first_turn=traj.steps[a].step,
                prompt_ids=prompt,
                completion_ids=completion,
                completion_mask=mask,
                completion_logprobs=logprobs,
                memory_mask=memory,
                token_advantages=advantages,
                advantage=traj.steps[0].advantage,
                episode_return=traj.episode_return,
                won=traj.won,
                turns=b - a,
                policy_versions=[g.policy_version for g in gens[a:b]],
            )
        )
    return samples


def _tokens_of(s: StepRecord, uid: str) -> Generation:
    """Step ``s``'s generation, which must hold its token ids and log-probs."""
    g = s.generation
    if g is None or not g.has_tokens or g.response_logprobs is None:
        raise LayoutError(
            f"rollout.layout=episode needs the token ids and log-probs of every turn, but "
            f"step {s.step} of episode {uid} has none: use a policy that samples tokens "
            "(policy=hf, or policy=openai with policy.params.return_tokens=true)"
        )
    return g


_Tokens = tuple[list[int], list[int], list[int], list[float], list[int] | None, list[float] | None]


def _stitch(steps: Sequence[StepRecord], gens: Sequence[Generation], blocks: bool) -> _Tokens:
    """Turn 1's prompt ids, then the completion ids, mask, log-probs, memory mask (None unless
    every turn's is known) and step advantages (0 on env tokens; None until all are known) of
    one segment as one token sequence."""
    prompt = context = list(gens[0].prompt_ids or [])
    completion, mask, logprobs, advantages = list[int](), list[int](), list[float](), list[float]()
    memory: list[int] | None = []
    for s, g in zip(steps, gens, strict=True):
        ids = list(g.prompt_ids or [])
        env = ids[len(context) :]  # the segment's turns extend the context (_breaks)
        response = list(g.response_ids or [])
        completion += env + response
        mask += [0] * len(env) + [1] * len(response)
        logprobs += [0.0] * len(env) + list(g.response_logprobs or [])
        advantages += [0.0] * len(env) + [float(s.advantage or 0.0)] * len(response)
        written = memory_tokens(s, len(response), blocks)
        memory = None if memory is None or written is None else memory + [0] * len(env) + written
        context = ids + response
    known = all(s.advantage is not None for s in steps)
    return prompt, completion, mask, logprobs, memory, advantages if known else None


def memory_tokens(step: StepRecord, n: int, blocks: bool = True) -> list[int] | None:
    """Per sampled token of ``step`` (``n`` of them), 1 where it writes the memory: all of a
    memory turn's (a policy-written summary), the ``<memory>`` block's of an action
    (``step.memory_mask``), else 0; None when the step does not say (no ``memory_mask`` while
    the memory may take ``blocks`` from responses).

    Example:
        >>> from dataclasses import replace
        >>> s = StepRecord(1, "", "", None, True, None, 0.0, False, False, 0, 0, 0, None)
        >>> memory_tokens(s, 2), memory_tokens(replace(s, memory_turn=True), 2)
        (None, [1, 1])
        >>> memory_tokens(replace(s, memory_mask=[1, 0]), 2), memory_tokens(s, 2, blocks=False)
        ([1, 0], [0, 0])
    """
    if step.memory_turn:
        return [1] * n
    if step.memory_mask is None:
        return None if blocks else [0] * n
    return list(step.memory_mask)


def _breaks(uid: str, k: int, gens: Sequence[Generation], strict: bool, fix: str) -> bool:
    """Whether turn ``k + 1``'s prompt breaks from turn ``k``'s (``strict``: raise instead)."""
    context = [*(gens[k - 1].prompt_ids or ()), *(gens[k - 1].response_ids or ())]
    ids = list(gens[k].prompt_ids or ())
    cut = _divergence(context, ids)
    if cut is not None and strict:
        raise PrefixBroken(
            f"episode {uid}: turn {k + 1}'s prompt does not start with turn {k}'s prompt and "
            f"response (first difference at token {cut}: {_at(context, cut)} in the context "
            f"vs {_at(ids, cut)} in the prompt), so no single token sequence is what the model "
            "saw, though this job's chat only grows (the whole history, env.formatter="
            f"transcript, no token budget): {fix}"
        )
    return cut is not None


def _divergence(context: Sequence[int], ids: Sequence[int]) -> int | None:
    """The first position where ``ids`` does not continue with ``context`` (None: it does)."""
    head = list(ids[: len(context)])
    if head == list(context):
        return None
    return next(
        (j for j, (a, b) in enumerate(zip(context, head, strict=False)) if a != b), len(head)
    )


def _at(ids: Sequence[int], j: int) -> str:
    return str(ids[j]) if j < len(ids) else "the end"
