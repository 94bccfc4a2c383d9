"""Policies: batched ``act(prompts, meta) -> responses``, selectable by name from config."""

from __future__ import annotations

from agent_memory.policies.base import (
    Policy,
    Prompt,
    available_policies,
    make_policy,
    policy_factory,
    register_policy,
)

__all__ = [
    "Policy",
    "Prompt",
    "available_policies",
    "make_policy",
    "policy_factory",
    "register_policy",
]
