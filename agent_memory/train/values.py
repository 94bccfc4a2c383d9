"""The trainer's policy (a local model's) and the value head's estimates over the token ids it
renders (PPO's ``V(s)``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from agent_memory.rollout.driver.advantages import TrajectoryValues
from agent_memory.rollout.types import Trajectory
from agent_memory.train.logprobs import prompt_hidden

if TYPE_CHECKING:
    from agent_memory.policies import Policy
    from agent_memory.policies.hf import HFPolicy
    from agent_memory.policies.scoring import ScoringPolicy

__all__ = ["TrainPolicy", "estimate_values", "train_policy"]

#: The policies a trainer samples with (``TrainConfig`` admits ``policy=hf`` and ``score``):
#: local models that render prompts to token ids (:func:`estimate_values` reads them).
TrainPolicy: TypeAlias = "HFPolicy | ScoringPolicy"


def train_policy(policy: Policy) -> TrainPolicy:
    """``policy``, typed as the trainer's: a local model's (``TrainConfig`` admits no other).

    Raises:
        TypeError: another policy.

    Example:
        >>> from agent_memory.policies import make_policy
        >>> train_policy(make_policy("random"))
        Traceback (most recent call last):
        ...
        TypeError: a trainer's policy is a local model's (hf or score), got RandomPolicy: ...
    """
    from agent_memory.policies.hf import HFPolicy
    from agent_memory.policies.scoring import ScoringPolicy

    if not isinstance(policy, (HFPolicy, ScoringPolicy)):
        raise TypeError(
            "a trainer's policy is a local model's (hf or score), got "
            f"{type(policy).__name__}: pass policy=hf or policy=score"
        )
    return policy


def estimate_values(
    model: Any,
    value_head: Any,
    policy: TrainPolicy,
    trajs: Sequence[Trajectory],
    pad_id: int,
    batch_size: int = 64,
) -> dict[str, TrajectoryValues]:
    """The value head's ``V(s_t)`` for every step (from its recorded prompt ids) and ``V(s_T)``
    of each truncated episode's final prompt (rendered as the policy renders prompts)."""
    import torch

    prompts: list[Sequence[int]] = []
    for tr in trajs:
        for s in tr.steps:
            if s.memory_turn:  # valued as the action it prepares (compute_advantages)
                continue
            assert s.generation is not None and s.generation.prompt_ids is not None
            prompts.append(s.generation.prompt_ids)
    finals = [tr for tr in trajs if tr.steps and not tr.terminated]
    prompts += [policy.renderer.ids(tr.final_prompt) for tr in finals]
    values: list[float] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            hidden = prompt_hidden(model, prompts[start : start + batch_size], pad_id=pad_id)
            values += value_head(hidden).tolist()
    out, k = {}, 0
    uids = [tr.spec.traj_uid for tr in finals]
    final_of = dict(zip(uids, values[len(values) - len(finals) :], strict=True))
    for tr in trajs:
        uid, n = tr.spec.traj_uid, sum(not s.memory_turn for s in tr.steps)
        out[uid] = TrajectoryValues(values[k : k + n], final_of.get(uid, 0.0))
        k += n
    return out
