"""How rollouts become training samples: ``rollout.layout`` (docs/output-schema.md).

``step``: every step is a sample (the step rows). ``episode``: one sample per episode, true only
when every turn's prompt extends the previous turn's prompt and response (the *prefix
property*), which :func:`episode_sample` checks token by token (:class:`PrefixBroken`).

Example:
    >>> from agent_memory.protocol import Generation
    >>> from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
    >>> def step(k, prompt, response):
    ...     g = Generation("", prompt_ids=prompt, response_ids=response,
    ...                    response_logprobs=[-0.5] * len(response))
    ...     return StepRecord(k, "", "", None, True, None, 1.0, k == 2, False, len(prompt), 0, 0,
    ...                       None, generation=g)
    >>> t = Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 7), [step(1, [1, 2], [3, 9]),
    ...                step(2, [1, 2, 3, 9, 4], [5, 9])], won=True)
    >>> s = episode_sample(t)
    >>> s.prompt_ids, s.completion_ids, s.completion_mask
    ([1, 2], [3, 9, 4, 5, 9], [1, 1, 0, 1, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_memory.protocol import Generation
from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = ["LAYOUTS", "EpisodeSample", "LayoutError", "PrefixBroken", "episode_sample"]

LAYOUTS: tuple[str, ...] = ("step", "episode")


class LayoutError(ValueError):
    """Steps that cannot make an episode sample (e.g. recorded without token ids)."""


class PrefixBroken(LayoutError):
    """A turn's prompt is not the previous turn's prompt and response followed by new tokens."""


@dataclass(frozen=True)
class EpisodeSample:
    """One trainable sample per episode (the ``episode`` layout): the fields are the columns of
    :data:`~agent_memory.rollout.driver.writer.EPISODE_COLUMNS`, as :meth:`row` gives them."""

    group_uid: str
    traj_uid: str
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    token_advantages: list[float] | None
    advantage: float | None
    episode_return: float
    won: bool
    turns: int
    policy_versions: list[int | None]

    def row(self) -> dict[str, Any]:
        """The sample as a JSON/Arrow row (field names as above)."""
        return dict(self.__dict__)


def episode_sample(traj: Trajectory) -> EpisodeSample:
    """``traj`` as one sample (see the module docstring).

    Raises:
        LayoutError: a step without token ids, or an episode without steps.
        PrefixBroken: a turn whose prompt does not extend the previous turn's context.
    """
    uid = traj.spec.traj_uid
    if not traj.steps:
        raise LayoutError(f"episode {uid} has no steps ({traj.error or 'it never started'})")
    gens = [_tokens_of(s, uid) for s in traj.steps]
    prompt, completion, mask, logprobs, owner = _stitch(gens, uid)
    advantages = [s.advantage for s in traj.steps]
    return EpisodeSample(
        group_uid=traj.spec.group_uid, traj_uid=uid, prompt_ids=prompt, completion_ids=completion,
        completion_mask=mask, completion_logprobs=logprobs,
        token_advantages=_token_advantages(advantages, owner), advantage=advantages[0],
        episode_return=traj.episode_return, won=traj.won, turns=len(gens),
        policy_versions=[g.policy_version for g in gens],
    )  # fmt: skip


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


_Tokens = tuple[list[int], list[int], list[int], list[float], list[int]]


def _stitch(gens: Sequence[Generation], uid: str) -> _Tokens:
    """Turn 1's prompt ids, then the completion ids, mask and log-probs, and each completion
    token's step (-1: env tokens), of ``gens`` as one token sequence."""
    prompt = context = list(gens[0].prompt_ids or [])
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    owner: list[int] = []
    for k, g in enumerate(gens):
        ids = list(g.prompt_ids or [])
        _check_prefix(uid, k, context, ids)  # turn 1 extends its own prompt
        env = ids[len(context) :]
        response = list(g.response_ids or [])
        completion += env + response
        mask += [0] * len(env) + [1] * len(response)
        logprobs += [0.0] * len(env) + list(g.response_logprobs or [])
        owner += [-1] * len(env) + [k] * len(response)
        context = ids + response
    return prompt, completion, mask, logprobs, owner


def _check_prefix(uid: str, k: int, context: list[int], ids: list[int]) -> None:
    """Raise :class:`PrefixBroken` unless turn ``k + 1``'s prompt ``ids`` extends ``context``."""
    cut = _divergence(context, ids)
    if cut is not None:
        raise PrefixBroken(
            f"episode {uid}: turn {k + 1}'s prompt does not start with turn {k}'s prompt and "
            f"response (first difference at token {cut}: {_at(context, cut)} in the context "
            f"vs {_at(ids, cut)} in the prompt), so no single token sequence is what the model "
            "saw. rollout.layout=episode needs a chat that only grows (env.history_length=-1, "
            "env.formatter=transcript) rendered incrementally (policy.params.incremental="
            "true), and a chat template that does not re-render earlier turns; otherwise use "
            "rollout.layout=step"
        )


def _token_advantages(advantages: Sequence[float | None], owner: list[int]) -> list[float] | None:
    """Each completion token's step advantage (0.0 on env tokens); None until all are known."""
    if any(a is None for a in advantages):
        return None
    return [0.0 if j < 0 else float(advantages[j] or 0.0) for j in owner]


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
