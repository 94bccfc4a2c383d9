"""The settings of :class:`~agent_memory.memory.blackboard.BlackboardMemory`, validated once."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from agent_memory.checks import check_choice, check_int, check_number, check_str
from agent_memory.config_fields import setting
from agent_memory.memory.settings import Settings

__all__ = ["BlackboardSettings", "Scope"]

Scope = Literal["group", "global"]


@dataclass(frozen=True)
class BlackboardSettings(Settings):
    """Where the board is and what a prompt shows of it (the arguments of the same names of
    :class:`~agent_memory.memory.blackboard.BlackboardMemory`).

    Example:
        >>> BlackboardSettings(top_n=2, author="w1").note_format.format(
        ...     text="hi", env_id=0, step=3, group="g", author="w1")
        '- [env 0, step 3] hi'
        >>> BlackboardSettings(max_notes=0)
        Traceback (most recent call last):
        ...
        ValueError: max_notes must be None or an int >= 1, got 0
    """

    path: str | os.PathLike[str] | None = setting(
        None,
        "SQLite file shared by the workers (one host; {output_dir} is the run's output "
        "directory); null: a private in-memory board per worker.",
        config_default="{output_dir}/blackboard.sqlite",
    )
    board: str = setting("default", "Board name inside the file.")
    scope: Scope = setting(
        "group", "group: envs of one GRPO group see each other's notes; global: every env does."
    )
    top_n: int = setting(5, "Notes shown per prompt (newest first).")
    max_notes: int | None = setting(1000, "Notes the board keeps (oldest trimmed).")
    max_age_seconds: float | None = setting(
        None, "Notes older than this are dropped and hidden (null: no age limit)."
    )
    post_actions: bool = setting(False, "Also post every step's action as a note.")
    digest_chars: int = setting(300, "Longest episode digest posted at an episode's end.")
    note_chars: int = setting(500, "Longer notes are cut to this many characters.")
    note_format: str = setting(
        "- [env {env_id}, step {step}] {text}", "How a note is written into the prompt."
    )
    header: str = setting("Shared notes (newest first):", "Opens the notes block.")
    window_header: str = setting("Recent steps:", "Line before the recent window.")
    author: str | None = setting(None, "Who posts (stored with each note; null: pid<process id>).")
    timeout: float = setting(30.0, "Seconds a writer waits for the database lock.")
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        try:
            self.note_format.format(text="t", env_id=0, step=1, group="g", author="a")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise ValueError(
                f"note_format may use the fields text, env_id, step, group, author; "
                f"{self.note_format!r} fails: {e!r}"
            ) from None
        self._normalize(
            path=None if self.path is None else str(self.path),
            board=check_str("board", self.board),
            scope=check_choice("scope", self.scope, ("group", "global")),
            top_n=check_int("top_n", self.top_n, 0),
            max_notes=check_int("max_notes", self.max_notes, 1, allow_none=True),
            max_age_seconds=check_number(
                "max_age_seconds", self.max_age_seconds, low=0, low_open=True, allow_none=True
            ),
            post_actions=bool(self.post_actions),
            digest_chars=check_int("digest_chars", self.digest_chars, 1),
            note_chars=check_int("note_chars", self.note_chars, 1),
            header=check_str("header", self.header),
            window_header=check_str("window_header", self.window_header, empty=True),
            author=f"pid{os.getpid()}" if self.author is None else str(self.author),
            timeout=check_number("timeout", self.timeout, low=0, low_open=True),
        )
