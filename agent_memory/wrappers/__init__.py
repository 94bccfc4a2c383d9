"""Gymnasium wrappers that own the interaction history: vector and single-env.

Layout: :mod:`~agent_memory.wrappers.options` (the settings), :mod:`~agent_memory.wrappers.state`
(per-env episode state), :mod:`~agent_memory.wrappers.recorder` (episodes: start, store,
hand-over, sessions), :mod:`~agent_memory.wrappers.prompt` (prompts and their budget),
:mod:`~agent_memory.wrappers.flow` (the step flow both wrappers share),
:mod:`~agent_memory.wrappers.hold` (stepping some sub-envs only), and the wrappers
(:mod:`~agent_memory.wrappers.vector`, :mod:`~agent_memory.wrappers.single`).
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
