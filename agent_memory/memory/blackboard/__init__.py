"""The ``blackboard`` strategy: each env's recent window plus notes shared across envs and
processes (:class:`BlackboardMemory`), its settings and its SQLite board (:class:`SQLiteBoard`).
"""

from __future__ import annotations

from agent_memory.memory.blackboard.board import SQLiteBoard
from agent_memory.memory.blackboard.settings import BlackboardSettings
from agent_memory.memory.blackboard.strategy import BlackboardMemory
from agent_memory.memory.digest import episode_digest

__all__ = ["BlackboardMemory", "BlackboardSettings", "SQLiteBoard", "episode_digest"]
