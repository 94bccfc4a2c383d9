"""The texts of :class:`~agent_memory.memory.episodic.EpisodicMemory`'s prompts: the block that
shows past episodes, and the replies to an agent's memory actions.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_memory.memory.digest import clip
from agent_memory.memory.episodic.store import MemoryRow

__all__ = ["outcome_text", "render_block", "render_results"]


def outcome_text(row: MemoryRow) -> str:
    """How an episode row ended, e.g. ``won in 6 steps (return 1.00)``.

    Example:
        >>> outcome_text(MemoryRow("episode", "k", "t", "", won=False, length=9, truncated=True))
        'failed after 9 steps, time limit'
    """
    n = "?" if row.length is None else row.length
    steps = f"{n} step" if n == 1 else f"{n} steps"
    ret = "" if row.ret is None else f" (return {row.ret:.2f})"
    if row.won:
        return f"won in {steps}{ret}"
    if row.won is None:
        return f"ended after {steps}, outcome unknown{ret}"
    why = ", time limit" if row.truncated else ""
    return f"failed after {steps}{why}{ret}"


def render_block(header: str, entries: Sequence[tuple[str, MemoryRow]], max_chars: int) -> str:
    """The block of past episodes: ``header``, then each ``(label, row)`` numbered with its
    outcome and digest; the last entries are dropped to fit ``max_chars`` (``""``: none).

    Example:
        >>> row = MemoryRow("episode", "k", "t", "Actions (1): up", won=True, length=1)
        >>> print(render_block("Past episodes of this task:", [("this task", row)], 200))
        Past episodes of this task:
        1. [this task] won in 1 step
           Actions (1): up
    """
    if not entries:
        return ""
    parts = []
    for n, (label, row) in enumerate(entries, 1):
        body = "\n".join("   " + line for line in row.text.splitlines())
        parts.append(f"{n}. [{label}] {outcome_text(row)}\n{body}")
    # Drop the least relevant entries until the block fits, then cut.
    while len(parts) > 1 and len(header) + sum(len(p) + 1 for p in parts) > max_chars:
        parts.pop()
    return clip("\n".join([header, *parts]), max_chars)


def render_results(query: str, hits: Sequence[tuple[float, MemoryRow]], key: str | None) -> str:
    """The reply to an agent's ``<retrieve>query</retrieve>``: one line per hit (``key``: the
    asking env's task key, shown as ``this task``).

    Example:
        >>> note = MemoryRow("note", "k", "t", "the key is\\nunder the mat")
        >>> print(render_results("key", [(1.0, note)], "k"))
        Memory results for 'key':
        1. [this task, note, open] the key is / under the mat
        >>> render_results("door", [], "k")
        "Memory: nothing matches 'door'."
    """
    if not hits:
        return f"Memory: nothing matches {clip(query, 80)!r}."
    lines = [f"Memory results for {clip(query, 80)!r}:"]
    for n, (_, r) in enumerate(hits, 1):
        where = "this task" if r.task_key == key else f"other task: {clip(r.task, 60)}"
        what = "note" if r.kind == "note" else "episode"
        status = outcome_text(r) if (r.kind == "episode" or r.won is not None) else "open"
        text = " / ".join(r.text.splitlines())
        lines.append(f"{n}. [{where}, {what}, {status}] {clip(text, 300)}")
    return "\n".join(lines)
