"""``PolicyService``: one policy (a local model) serving every rollout worker, batched.

A Ray actor holding the one copy of the model: each worker sends one request for the envs whose
answers it awaits, and requests from many workers are batched dynamically
(:class:`~agent_memory.policies.batching.BatchingPolicy`), so the model still runs full batches.
A trainer sends new weights with :meth:`PolicyService.set_weights`; each answer carries the
version that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_memory.policies.base import Policy
from agent_memory.policies.batching import BatchingPolicy
from agent_memory.protocol import Generation

__all__ = ["PolicyService"]


class PolicyService:
    """A batching policy server for the rollout workers (used as a Ray actor).

    Args:
        policy: the policy (built in this process; e.g. the job's ``hf`` policy).
        max_batch_size: the most prompts per model call.
        max_wait_ms: how long a batch's first prompt waits for more.
    """

    def __init__(self, policy: Policy, max_batch_size: int = 32, max_wait_ms: float = 5.0) -> None:
        self.policy = policy
        self.greedy: Policy | None = None
        self.batcher = BatchingPolicy(
            policy, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms
        )

    async def generate(
        self,
        prompts: Sequence[Any],
        meta: Sequence[Mapping[str, Any]] | None = None,
        alone: bool = False,
    ) -> list[Generation]:
        """The generations of ``prompts``, from a batch shared with other callers (``alone``:
        a batch of their own, as ``rollout.mode=lockstep`` asks)."""
        return await self.batcher.agenerate(prompts, meta, alone=alone)

    def set_greedy(self, greedy: bool) -> None:
        """Answer greedily (an evaluation's collect) or by the policy's own sampling."""
        if greedy and self.greedy is None:
            self.greedy = self.policy.greedy()
        self.batcher.policy = self.greedy if greedy and self.greedy else self.policy

    def set_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        """Load new weights (a model's ``state_dict``) and call them ``version``."""
        model: Any = getattr(self.policy, "model", None)  # a local model's policy (hf, score)
        if model is None:
            raise TypeError(f"{type(self.policy).__name__} has no model to load weights into")
        model.load_state_dict(state_dict)
        self.policy.version = version
        if self.greedy is not None:  # shares the model
            self.greedy.version = version
        return version

    def policy_calls(self) -> int:
        """How many batches the sampling policy has answered (its sampling stream's position)."""
        return self.policy.calls

    def stats(self) -> dict[str, Any]:
        """The batcher's counters (requests, batches, mean batch size, busy seconds)."""
        return self.batcher.stats.as_dict()

    def close(self) -> None:
        """Release the policy."""
        self.policy.close()
