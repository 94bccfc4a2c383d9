"""The settings of :class:`~agent_memory.memory.compaction.CompactionMemory`, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent_memory.checks import check_choice, check_int, check_number
from agent_memory.config_fields import setting
from agent_memory.memory.compaction.summarizers import SummarizerSpec
from agent_memory.memory.settings import Settings

__all__ = ["CompactionSettings"]


@dataclass(frozen=True)
class CompactionSettings(Settings):
    """When :class:`~agent_memory.memory.compaction.CompactionMemory` compacts, how it summarizes
    and what it offloads (its arguments of the same names, ``max_history_tokens`` and
    ``capacity`` too).

    Example:
        >>> CompactionSettings(trigger_steps=8, keep_last=3).keep_last
        3
        >>> CompactionSettings(trigger_steps=5, keep_last=5)
        Traceback (most recent call last):
        ...
        ValueError: keep_last must be < trigger_steps (compaction keeps keep_last steps verbatim \
and folds the rest once more than trigger_steps are held), got keep_last=5, trigger_steps=5
    """

    max_history_tokens: int | None = None
    capacity: int | None = None
    trigger_steps: int | None = setting(
        8,
        "Compact once more than this many verbatim steps are held (null: only the token trigger).",
    )
    trigger_ratio: float | None = setting(
        0.8,
        "Compact once steps + summary exceed this fraction of memory.max_history_tokens (used "
        "when it is set).",
    )
    keep_last: int = setting(3, "Verbatim steps kept at each compaction (< trigger_steps).")
    summarizer: SummarizerSpec = setting(
        "extractive",
        "extractive (no model) | llm | {name: llm, policy: {name: ..., ...}, prompt: ...} | "
        "policy (the acting policy writes it, as a turn of its episode: rows with "
        "memory_turn, trained).",
    )
    summary_max_tokens: int = setting(256, "Token budget of each env's summary.")
    summary_timeout: float | None = setting(
        30.0,
        "Seconds a model summarizer may take before falling back to truncation (null: no limit).",
    )
    summary_role: Literal["user", "system"] = setting(
        "user", "Role of the summary message with the chat formatter: user | system."
    )
    summary_header: str = setting(
        "Summary of steps {first}-{last}:", "First line of the summary block."
    )
    offload_chars: int | None = setting(
        4000,
        "Observations longer than this are shown as a preview + id and reloadable by id "
        "(null: never).",
    )
    offload_preview: int = setting(200, "Characters in an offloaded observation's preview.")
    offload_capacity: int | None = setting(
        None, "Offloaded texts kept per env, oldest evicted (null: all)."
    )
    max_events: int = setting(1000, "Compaction events kept in memory.events.")

    def __post_init__(self) -> None:
        max_history_tokens = check_int(
            "max_history_tokens", self.max_history_tokens, 0, allow_none=True
        )
        keep_last = check_int("keep_last", self.keep_last, 1)
        trigger_steps = check_int("trigger_steps", self.trigger_steps, 1, allow_none=True)
        capacity = check_int("capacity", self.capacity, 1, allow_none=True)
        for name, value in (("trigger_steps", trigger_steps), ("capacity", capacity)):
            if value is not None and keep_last >= value:
                raise ValueError(
                    f"keep_last must be < {name} (compaction keeps keep_last steps verbatim and "
                    f"folds the rest once more than {name} are held), got keep_last={keep_last}, "
                    f"{name}={value}"
                )
        ratio = check_number(
            "trigger_ratio", self.trigger_ratio, low=0, high=1, low_open=True, allow_none=True
        )
        if (
            trigger_steps is None
            and capacity is None
            and (ratio is None or max_history_tokens is None)
        ):
            raise ValueError(
                "compaction needs a trigger: set trigger_steps, capacity, or trigger_ratio "
                f"together with max_history_tokens; got trigger_steps=None, capacity=None, "
                f"trigger_ratio={self.trigger_ratio!r}, max_history_tokens={max_history_tokens!r}"
            )
        summary_max_tokens = check_int("summary_max_tokens", self.summary_max_tokens, 16)
        if (
            ratio is not None
            and max_history_tokens is not None
            and summary_max_tokens >= ratio * max_history_tokens
        ):
            raise ValueError(
                "summary_max_tokens must be < trigger_ratio * max_history_tokens (the summary "
                "alone would keep the token trigger firing), got summary_max_tokens="
                f"{summary_max_tokens}, trigger_ratio * max_history_tokens = "
                f"{ratio * max_history_tokens:g}"
            )
        self._check_template("summary_header", first=1, last=2)
        self._normalize(
            max_history_tokens=max_history_tokens,
            capacity=capacity,
            trigger_steps=trigger_steps,
            trigger_ratio=ratio,
            keep_last=keep_last,
            summary_max_tokens=summary_max_tokens,
            summary_timeout=check_number(
                "summary_timeout", self.summary_timeout, low=0, low_open=True, allow_none=True
            ),
            summary_role=check_choice("summary_role", self.summary_role, ("user", "system")),
            offload_chars=check_int("offload_chars", self.offload_chars, 1, allow_none=True),
            offload_preview=check_int("offload_preview", self.offload_preview, 0),
            offload_capacity=check_int(
                "offload_capacity", self.offload_capacity, 1, allow_none=True
            ),
            max_events=check_int("max_events", self.max_events, 0),
        )
