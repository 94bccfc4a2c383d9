"""The ``retrieval`` strategy: the recent window plus the most relevant older steps of the same
episode (:class:`RetrievalMemory`), with its settings and the ranking over per-env step indexes.
"""

from __future__ import annotations

from agent_memory.memory.retrieval.settings import RetrievalSettings
from agent_memory.memory.retrieval.strategy import RetrievalMemory

__all__ = ["RetrievalMemory", "RetrievalSettings"]
