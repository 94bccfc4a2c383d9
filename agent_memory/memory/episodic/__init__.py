"""The ``episodic`` strategy: each env's window plus a memory of past episodes, across episodes
and runs (:class:`EpisodicMemory`): its settings, archive, SQLite store, task keys and rendering.
"""

from __future__ import annotations

from agent_memory.memory.digest import episode_digest
from agent_memory.memory.episodic.settings import EpisodicSettings
from agent_memory.memory.episodic.store import EpisodeStore, MemoryRow, Scope
from agent_memory.memory.episodic.strategy import AGENT_INSTRUCTIONS, EpisodicMemory
from agent_memory.memory.episodic.tasks import lexical_scores, task_key_of

__all__ = [
    "AGENT_INSTRUCTIONS",
    "EpisodeStore",
    "EpisodicMemory",
    "EpisodicSettings",
    "MemoryRow",
    "Scope",
    "episode_digest",
    "lexical_scores",
    "task_key_of",
]
