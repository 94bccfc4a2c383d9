"""Memory strategies by name, so a config switch (``memory=window``) swaps them inside the wrappers.

Every strategy is built as ``factory(num_envs=..., formatter=..., token_counter=...,
max_history_tokens=..., capacity=..., **params)``: the shared arguments the wrappers pass (a
strategy may ignore some), plus its own ``params`` from its config.

Example:
    >>> from agent_memory.memory import make_memory
    >>> mem = make_memory("window", num_envs=2, formatter="search")
    >>> type(mem).__name__, len(mem)
    ('HistoryMemory', 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agent_memory.memory.base import BaseMemory
from agent_memory.registry import Registry

__all__ = ["available_memories", "make_memory", "memory_factory", "register_memory"]


F = TypeVar("F", bound=Callable[..., BaseMemory])
_REGISTRY: Registry[BaseMemory] = Registry(
    "memory strategy",
    hint=" (choose one with e.g. memory=window, or register yours with "
    "agent_memory.memory.register_memory)",
    # Imported when first named, so one strategy's optional dependencies never slow down or
    # break ``import agent_memory``.
    builtins={
        "window": "agent_memory.memory.window:HistoryMemory",
        "history": "agent_memory.memory.window:HistoryMemory",  # the window's former name
        # The window with a fixed history length (agent_memory.config.FIXED_HISTORY).
        "none": "agent_memory.memory.window:HistoryMemory",
        "full": "agent_memory.memory.window:HistoryMemory",
        "compaction": "agent_memory.memory.compaction.strategy:CompactionMemory",
        "retrieval": "agent_memory.memory.retrieval.strategy:RetrievalMemory",
        "episodic": "agent_memory.memory.episodic.strategy:EpisodicMemory",
        "blackboard": "agent_memory.memory.blackboard.strategy:BlackboardMemory",
        "conversation": "agent_memory.memory.conversation.strategy:ConversationMemory",
        "notes": "agent_memory.memory.notes:NotesMemory",
    },
)


def register_memory(name: str, *, overwrite: bool = False) -> Callable[[F], F]:
    """Class decorator: make a memory strategy available to :func:`make_memory` as ``name``."""
    return _REGISTRY.register(name, overwrite=overwrite)


def available_memories() -> list[str]:
    """Names :func:`make_memory` accepts."""
    return _REGISTRY.names()


def memory_factory(strategy: str) -> Callable[..., BaseMemory]:
    """The class (or factory) registered as ``strategy``: its ``settings_class`` (else its
    signature) lists what ``memory.params`` may set.

    Raises:
        ValueError: unknown strategy (the message lists the registered ones).
    """
    return _REGISTRY.get(strategy)


def make_memory(strategy: str, *, num_envs: int, **kwargs: Any) -> BaseMemory:
    """Build the memory strategy registered as ``strategy`` for ``num_envs`` envs.

    Raises:
        ValueError: unknown strategy (the message lists the registered ones and the override).
    """
    return _REGISTRY.make(strategy, num_envs=num_envs, **kwargs)
