"""Batched memories: one independent history per environment (see :class:`BaseMemory`).

Strategies are selected by name with :func:`make_memory`: ``window`` (:class:`HistoryMemory`),
``compaction``, ``retrieval``, ``episodic``, ``blackboard``, ``conversation`` (one subpackage each)
and ``notes`` (written by the policy itself). Strategies that show a block before a per-env window
subclass :class:`WindowedMemory`.
"""

from __future__ import annotations

from agent_memory.memory.base import BaseMemory, EnvIds, Fetched, normalize_env_ids
from agent_memory.memory.block_window import WindowedMemory
from agent_memory.memory.registry import (
    available_memories,
    make_memory,
    memory_factory,
    register_memory,
)
from agent_memory.memory.window import HistoryMemory

__all__ = [
    "BaseMemory",
    "EnvIds",
    "Fetched",
    "HistoryMemory",
    "WindowedMemory",
    "available_memories",
    "make_memory",
    "memory_factory",
    "normalize_env_ids",
    "register_memory",
]
