"""How rollouts become training samples: ``rollout.layout``.

* ``step`` (verl-agent's): every step is a sample — its own memory-built prompt (``prompt_ids``)
  and the response the model sampled (``response_ids``, ``response_logprobs``, ``response_mask`` of
  ones); the step-wise advantages (GRPO per trajectory, GiGPO step groups, GAE) attach to it. These
  are the rows of ``trajectories.jsonl`` / ``.parquet``.
* ``episode`` (TRL's ``env_mask``, verl's ``response_mask``, OpenRLHF's action ranges): one sample
  per episode of a full-history chat — turn 1's prompt ids, then everything after them as one
  ``completion_ids`` sequence: the model's tokens (``completion_mask`` 1, their sampling
  log-probs) and, between them, the tokens the env and the template added (mask 0, log-prob 0).
  Written as ``episodes.jsonl`` / ``.parquet`` beside the step rows.

An episode sample is only true if every turn's prompt is the previous turn's prompt plus its
response plus new tokens (the *prefix property*): the model then saw, at every turn, exactly the
sample's tokens up to that point. :func:`episode_sample` checks it token by token and refuses an
episode that breaks it with :class:`PrefixBroken`, saying where. What keeps it: a chat that only
grows (``env.history_length=-1`` with the ``transcript`` formatter) rendered incrementally
(``policy.params.incremental=true``), so the model conditions on its own sampled ids; what breaks
it: a window or summary that rewrites history, or a chat template that re-renders earlier turns
(e.g. one that drops past reasoning).

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
from typing import Any, Literal

from agent_memory.rollout.types import Trajectory

__all__ = ["LAYOUTS", "EpisodeSample", "LayoutError", "PrefixBroken", "episode_sample"]

Layout = Literal["step", "episode"]
LAYOUTS: tuple[str, ...] = ("step", "episode")


class LayoutError(ValueError):
    """Steps that cannot make an episode sample (e.g. recorded without token ids)."""


class PrefixBroken(LayoutError):
    """A turn's prompt is not the previous turn's prompt and response followed by new tokens."""


@dataclass(frozen=True)
class EpisodeSample:
    """One trainable sample per episode (the ``episode`` layout; see the module docstring).

    Attributes:
        group_uid, traj_uid: the episode and its group.
        prompt_ids: turn 1's prompt ids.
        completion_ids: every later token the model was conditioned on or produced.
        completion_mask: 1 for the model's tokens, 0 for the env's and the template's.
        completion_logprobs: the model's tokens' sampling log-probs, 0.0 elsewhere.
        token_advantages: each model token's step advantage (0.0 elsewhere; None until the
            group's advantages are computed).
        advantage: the episode's advantage (its first step's; GRPO gives every step the same).
        episode_return: the sum of its rewards.
        won: the env's verdict.
        turns: the model's turns.
        policy_versions: the weights' versions that answered, per turn.
    """

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
    gens = []
    for s in traj.steps:
        g = s.generation
        if g is None or not g.has_tokens or g.response_logprobs is None:
            raise LayoutError(
                f"rollout.layout=episode needs the token ids and log-probs of every turn, but "
                f"step {s.step} of episode {uid} has none: use a policy that samples tokens "
                "(policy=hf, or policy=openai with policy.params.return_tokens=true)"
            )
        gens.append(g)
    first = gens[0]
    prompt = list(first.prompt_ids or [])
    context = [*prompt, *(first.response_ids or [])]
    completion = list(first.response_ids or [])
    mask = [1] * len(completion)
    logprobs = list(first.response_logprobs or [])
    owner = [0] * len(completion)  # which step each model token belongs to (-1: env tokens)
    for k, g in enumerate(gens[1:], start=1):
        ids = list(g.prompt_ids or [])
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
        env = ids[len(context) :]
        response = list(g.response_ids or [])
        completion += env + response
        mask += [0] * len(env) + [1] * len(response)
        logprobs += [0.0] * len(env) + list(g.response_logprobs or [])
        owner += [-1] * len(env) + [k] * len(response)
        context = ids + response
    advantages = [s.advantage for s in traj.steps]
    token_adv = None
    if all(a is not None for a in advantages):
        token_adv = [0.0 if j < 0 else float(advantages[j] or 0.0) for j in owner]
    return EpisodeSample(
        group_uid=traj.spec.group_uid,
        traj_uid=uid,
        prompt_ids=prompt,
        completion_ids=completion,
        completion_mask=mask,
        completion_logprobs=logprobs,
        token_advantages=token_adv,
        advantage=advantages[0],
        episode_return=traj.episode_return,
        won=traj.won,
        turns=len(gens),
        policy_versions=[g.policy_version for g in gens],
    )


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
