"""The ``compaction`` strategy: a window of recent steps plus a running summary of the older
ones (:class:`CompactionMemory`), its settings and its summarizers (:func:`register_summarizer`).
"""

from __future__ import annotations

from agent_memory.memory.compaction.settings import CompactionSettings
from agent_memory.memory.compaction.strategy import CompactionMemory
from agent_memory.memory.compaction.summarizers import (
    ExtractiveSummarizer,
    FoldedStep,
    LLMSummarizer,
    PolicySummarizer,
    Summarizer,
    SummaryRequest,
    available_summarizers,
    fit_text,
    make_summarizer,
    register_summarizer,
)

__all__ = [
    "CompactionMemory",
    "CompactionSettings",
    "ExtractiveSummarizer",
    "FoldedStep",
    "LLMSummarizer",
    "PolicySummarizer",
    "Summarizer",
    "SummaryRequest",
    "available_summarizers",
    "fit_text",
    "make_summarizer",
    "register_summarizer",
]
