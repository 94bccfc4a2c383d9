"""Batched memories: one independent history per environment (see :class:`BaseMemory`).

Strategies are selected by name with :func:`make_memory`: ``window`` (:class:`HistoryMemory`:
the sliding window / token budget / whole-episode memory; ``history`` is its former name) and,
one subpackage each, ``compaction``, ``retrieval``, ``episodic``, ``blackboard`` and
``conversation``. Strategies that show a block before a per-env window subclass
:class:`WindowedMemory` and lay the two out with one
:class:`~agent_memory.memory.block_window.BlockLayout`.

Layout: ``base`` (the contract), ``window`` (:class:`HistoryMemory`), ``block_window`` (the base
and layout of block + window strategies), ``settings`` (the strategies' frozen settings),
``sqlite`` (the SQLite layer of the stores), ``digest`` (the episode digest), ``search``
(encoders and vector indexes), ``registry``, and the strategy subpackages.
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
