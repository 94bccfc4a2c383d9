"""Tiny models built offline for tests and local tries (no download, CPU, seconds).

Example:
    >>> from agent_memory.models import DEFAULT_TEMPLATE, words_from_texts
    >>> words_from_texts(["go up."])
    ['go', 'up', '.']
"""

from __future__ import annotations

from agent_memory.models.pretrain import pretrain_tiny_lm
from agent_memory.models.tiny import (
    DEFAULT_TEMPLATE,
    ROLES,
    SPECIAL_TOKENS,
    build_tiny_lm,
    tag_tokens,
    template_words,
    words_from_texts,
)

__all__ = [
    "DEFAULT_TEMPLATE",
    "ROLES",
    "SPECIAL_TOKENS",
    "build_tiny_lm",
    "pretrain_tiny_lm",
    "tag_tokens",
    "template_words",
    "words_from_texts",
]
