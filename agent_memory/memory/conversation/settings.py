"""The settings of :class:`~agent_memory.memory.conversation.ConversationMemory`, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from agent_memory.checks import check_choice
from agent_memory.config_fields import setting
from agent_memory.memory.settings import Settings

__all__ = ["DEFAULT_THOUGHT_FORMAT", "ConversationSettings"]

DEFAULT_THOUGHT_FORMAT: Final = "<think>{thought}</think>\n<action>{action}</action>"


@dataclass(frozen=True)
class ConversationSettings(Settings):
    """How :class:`~agent_memory.memory.conversation.ConversationMemory` writes its messages
    (its arguments of the same names).

    Example:
        >>> ConversationSettings(ids="counter").thought_format == DEFAULT_THOUGHT_FORMAT
        True
        >>> ConversationSettings(thought_format="{why}")
        Traceback (most recent call last):
        ...
        ValueError: thought_format may use only {thought} and {action}, got '{why}' ('why')
    """

    system_prompt: str | None = setting(
        None,
        "System message each episode starts with (null: none; do not also set "
        "env.template.system).",
    )
    thought_format: str | None = setting(
        DEFAULT_THOUGHT_FORMAT,
        "Assistant content when a thought is present (null: thoughts are left out).",
    )
    ids: Literal["uuid", "counter"] = setting(
        "uuid", "Message ids: uuid, or counter (deterministic env{i}-ep{k}-{n})."
    )

    def __post_init__(self) -> None:
        check_choice("ids", self.ids, ("uuid", "counter"))
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise TypeError(
                f"system_prompt must be a str or None, got {type(self.system_prompt).__name__}"
            )
        if self.thought_format is not None:
            self._check_template("thought_format", thought="t", action="a")
