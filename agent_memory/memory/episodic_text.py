"""The texts of :class:`~agent_memory.memory.episodic.EpisodicMemory`: task keys, episode
digests and the blocks and replies that show past episodes in a prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agent_memory.memory.episode_store import MemoryRow

__all__ = [
    "KeyBy",
    "clip",
    "episode_digest",
    "outcome_text",
    "render_block",
    "render_results",
    "task_key_of",
]

KeyBy = Literal["task", "task_and_observation"]
_INVALID = "[invalid"


def task_key_of(
    task: str, observation: str | None = None, env_name: str | None = None, *,
    key_by: KeyBy = "task_and_observation",
) -> str:  # fmt: skip
    """``"<env_name>|<hash>"``: the hash covers the task text and, with ``task_and_observation``,
    the first observation (which tells apart levels that share a task sentence).

    Example:
        >>> task_key_of("Cross the lake.", "S . G", "lake")
        'lake|57b9548680a08c55'
    """
    text = task if key_by == "task" else f"{task}\x00{observation or ''}"
    # surrogatepass: a lone surrogate (hostile text) hashes instead of raising.
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{env_name or 'env'}|{digest}"


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, the cut marked with ``...``.

    Example:
        >>> clip("a long sentence", 9)
        'a long...'
    """
    return text if len(text) <= n else text[: max(0, n - 3)] + "..."


def episode_digest(
    episode: Mapping[str, Any], *, max_actions: int = 60, obs_chars: int = 300,
    max_chars: int = 1200,
) -> str:  # fmt: skip
    """A bounded text digest of a handed-over episode: its actions and its last observation.

    Invalid actions (``[invalid: ...]`` in the history: the env got a no-op) are left out of the
    action list and counted. Beyond ``max_actions`` the middle of the list is elided; the whole
    digest is cut to ``max_chars``.

    Example:
        >>> ep = {"records": [{"observation": "a", "action": "up"},
        ...                   {"observation": "b", "action": "[invalid: no tag]"},
        ...                   {"observation": "b", "action": "left"}],
        ...       "final_observation": "c", "num_steps": 3}
        >>> print(episode_digest(ep))
        Actions (2, 1 invalid left out): up; left
        Last observation: c
    """
    records = episode.get("records") or []
    # The digest is cut to max_chars: no action needs more (a hostile one is megabytes).
    actions = [str(r.get("action", ""))[: max_chars + 1] for r in records]
    valid = [a for a in actions if not a.startswith(_INVALID)]
    skipped = len(actions) - len(valid)
    first = int(episode.get("first_step", 1) or 1)
    notes = []
    if skipped:
        notes.append(f"{skipped} invalid left out")
    if first > 1:
        notes.append(f"steps 1-{first - 1} not kept")
    head = f"Actions ({len(valid)}{', ' + ', '.join(notes) if notes else ''}): "
    if len(valid) > max_actions:
        k = max_actions // 2
        shown = [*valid[:k], f"... {len(valid) - 2 * k} more ...", *valid[len(valid) - k :]]
    else:
        shown = valid
    lines = [head + "; ".join(shown)]
    final = episode.get("final_observation")
    if obs_chars > 0 and final:
        lines.append("Last observation: " + clip(str(final).strip(), obs_chars))
    return clip("\n".join(lines), max_chars)


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
    outcome and indented digest; the least relevant (last) entries are dropped until it fits
    ``max_chars``, then it is cut. ``""`` without entries.

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
