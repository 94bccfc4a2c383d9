"""Running a summarizer for :class:`~agent_memory.memory.compaction.CompactionMemory` safely.

A summarizer that may block runs in a thread with a timeout, so a hung model never stalls a
rollout; while a timed-out call still runs, later compactions fall back (``"busy"``). Without a
summary, :func:`dropped_summary` writes a truncation marker instead.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from agent_memory.memory.compaction.summarizers import Summarizer, SummaryRequest, fit_text
from agent_memory.tokens import TokenCounter

__all__ = ["Fallback", "SummaryRunner", "dropped_summary"]

Fallback = Literal["timeout", "error", "busy"]


class SummaryRunner:
    """Calls ``summarizer.summarize_batch`` inline, or in a thread with a timeout; remembers a
    timed-out call that still runs.

    Example:
        >>> from agent_memory.memory.compaction.summarizers import FoldedStep, make_summarizer
        >>> from agent_memory.tokens import make_token_counter
        >>> step = FoldedStep(step=1, text="", observation="a door", action="open")
        >>> request = SummaryRequest("", [step], 64)
        >>> runner, counter = SummaryRunner(), make_token_counter("estimate")
        >>> runner.run(make_summarizer("extractive"), [request], counter, timeout=5.0)
        (['1: a door -> open'], None, None)
    """

    def __init__(self) -> None:
        self.worker: threading.Thread | None = None  # a timed-out call still running

    def run(
        self,
        summarizer: Summarizer,
        requests: list[SummaryRequest],
        counter: TokenCounter,
        timeout: float | None,
    ) -> tuple[list[str] | None, Fallback | None, str | None]:
        """(summaries, None, None), or (None, fallback kind, reason) when it fails (``timeout``:
        seconds a ``may_block`` summarizer may take; ``None``: no limit, inline)."""
        s = summarizer

        def check(out: Any) -> list[str]:
            if not isinstance(out, list) or len(out) != len(requests):
                raise ValueError(
                    f"summarize_batch returned {type(out).__name__} of "
                    f"{len(out) if hasattr(out, '__len__') else '?'} items, expected a list of "
                    f"{len(requests)} strings"
                )
            return out

        if timeout is None or not s.may_block:
            try:
                return check(s.summarize_batch(requests, counter)), None, None
            except Exception as e:
                return None, "error", f"{type(e).__name__}: {e}"
        if self.worker is not None and self.worker.is_alive():
            # Threads cannot be killed: never pile up calls behind a hung one.
            return None, "busy", "a previous summarizer call timed out and is still running"
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = s.summarize_batch(requests, counter)
            except BaseException as e:  # reported to the caller, never lost in the thread
                box["err"] = e

        worker = threading.Thread(target=run, name="compaction-summarizer", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self.worker = worker
            return None, "timeout", f"no summary within summary_timeout={timeout}s"
        if "err" in box:
            err = box["err"]
            return None, "error", f"{type(err).__name__}: {err}"
        try:
            return check(box.get("out")), None, None
        except ValueError as e:
            return None, "error", f"ValueError: {e}"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a timed-out call that still runs; True when none runs (any more)."""
        worker = self.worker
        if worker is not None:
            worker.join(timeout)
            if worker.is_alive():
                return False
            self.worker = None
        return True


def dropped_summary(
    previous: str, first: int, last: int, max_tokens: int, counter: TokenCounter
) -> str:
    """Truncation fallback: the previous summary (cut to make room) and a drop marker.

    Example:
        >>> from agent_memory.tokens import make_token_counter
        >>> dropped_summary("1: a door -> open", 2, 4, 64, make_token_counter("estimate"))
        '1: a door -> open\\n[3 earlier steps dropped (steps 2-4)]'
    """
    n = last - first + 1
    marker = f"[{n} earlier step{'s' if n != 1 else ''} dropped (steps {first}-{last})]"
    if not previous:
        return fit_text(marker, max_tokens, counter)
    room = max_tokens - counter(marker + "\n")
    head = fit_text(previous, room, counter) if room > 0 else ""
    return f"{head}\n{marker}" if head else fit_text(marker, max_tokens, counter)
