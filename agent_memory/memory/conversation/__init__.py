"""The ``conversation`` strategy: per-env chat message records with ids, tool calls and safe
trimming (:class:`ConversationMemory`), its settings and message records.
"""

from __future__ import annotations

from agent_memory.memory.conversation.messages import ROLES, Message, select_messages
from agent_memory.memory.conversation.settings import ConversationSettings
from agent_memory.memory.conversation.strategy import ConversationMemory

__all__ = ["ROLES", "ConversationMemory", "ConversationSettings", "Message", "select_messages"]
