"""Gymnasium wrappers that own the interaction history: vector and single-env.

The settings are in :mod:`~agent_memory.wrappers.options`, the parts both wrappers are made of in
:mod:`~agent_memory.wrappers.base`, the wrappers in ``vector`` and ``single``.
"""

from __future__ import annotations

from agent_memory.wrappers.hold import Holdable, make_vec_holdable
from agent_memory.wrappers.options import HistoryOptions
from agent_memory.wrappers.prompt import PromptText
from agent_memory.wrappers.single import HistoryWrapper
from agent_memory.wrappers.state import EnvView
from agent_memory.wrappers.vector import VectorHistoryWrapper

__all__ = [
    "EnvView",
    "HistoryOptions",
    "HistoryWrapper",
    "Holdable",
    "PromptText",
    "VectorHistoryWrapper",
    "make_vec_holdable",
]
