"""Formatters: stored steps -> prompt context (text or chat messages), selectable by name.

Built-ins: ``simple`` and ``search`` (verl-agent, byte-identical), ``code`` (AppWorld blocks with a
character cap), ``chat`` (OpenAI-style messages), ``transcript`` (the policy's own conversation:
what it was shown, what it wrote) and ``jinja`` (a user template per step).
"""

from __future__ import annotations

from agent_memory.formatting.base import (
    Formatter,
    FormatterSpec,
    available_formatters,
    formatter_factory,
    make_formatter,
    register_formatter,
)
from agent_memory.formatting.formatters import (
    ChatFormatter,
    CodeFormatter,
    JinjaFormatter,
    SearchFormatter,
    SimpleFormatter,
    TranscriptFormatter,
)

__all__ = [
    "ChatFormatter",
    "CodeFormatter",
    "Formatter",
    "FormatterSpec",
    "JinjaFormatter",
    "SearchFormatter",
    "SimpleFormatter",
    "TranscriptFormatter",
    "available_formatters",
    "formatter_factory",
    "make_formatter",
    "register_formatter",
]
