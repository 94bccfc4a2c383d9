"""``HistoryCore``: the old name of the wrappers' parts, kept for callers that build them
outside a wrapper to check a prompt budget (``rollout/preflight.py``).

New code builds :class:`~agent_memory.wrappers.base.WrapperParts` (or a
:class:`~agent_memory.wrappers.prompt.PromptBuilder`) from a
:class:`~agent_memory.wrappers.HistoryOptions`.
"""

from __future__ import annotations

from typing import Any

from agent_memory.wrappers.base import WrapperParts
from agent_memory.wrappers.options import HistoryOptions

__all__ = ["HistoryCore"]


class HistoryCore:
    """The wrappers' parts for ``num_envs`` envs, built from keyword settings
    (:class:`~agent_memory.wrappers.HistoryOptions`); the same errors as the wrappers.

    Example:
        >>> HistoryCore(1, max_prompt_tokens=500).frame_tokens > 0
        True
    """

    def __init__(self, num_envs: int, **settings: Any) -> None:
        self.parts = WrapperParts.build(num_envs, HistoryOptions.merge(None, settings))

    @property
    def frame_tokens(self) -> int:
        """Tokens of the smallest prompt the template makes (empty observation, no history)."""
        return self.parts.builder.frame_tokens
