"""The digest of a finished episode, as the episodic memory and the blackboard write it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["clip", "episode_digest", "episode_outcome"]

_INVALID = "[invalid"


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, the cut marked with ``...``.

    Example:
        >>> clip("a long sentence", 9)
        'a long...'
    """
    return text if len(text) <= n else text[: max(0, n - 3)] + "..."


def episode_outcome(episode: Mapping[str, Any]) -> str:
    """How a handed-over episode ended, in words: ``won`` (``won`` is true), ``ended``
    (terminated), ``was cut off`` (truncated) or ``was left unfinished``.

    Example:
        >>> episode_outcome({"terminated": False, "truncated": True})
        'was cut off'
    """
    if episode.get("won"):
        return "won"
    if episode.get("terminated"):
        return "ended"
    if episode.get("truncated"):
        return "was cut off"
    return "was left unfinished"


def episode_digest(
    episode: Mapping[str, Any],
    *,
    max_actions: int = 60,
    obs_chars: int = 300,
    max_chars: int = 1200,
    outcome: bool = False,
    sep: str = "\n",
) -> str:
    """A bounded text digest of a handed-over episode: its actions and its last observation.

    Lines (joined by ``sep``): with ``outcome``, ``Episode <outcome> after <n> steps.``; then
    ``Actions (<count>): a; b; c`` (invalid actions left out and counted; beyond
    ``max_actions`` the middle ones elided); then ``Last observation: ...`` (its first
    ``obs_chars`` characters; 0: no such line). The digest is cut to ``max_chars``.

    Example:
        >>> ep = {"records": [{"observation": "a", "action": "up"},
        ...                   {"observation": "b", "action": "[invalid: no tag]"},
        ...                   {"observation": "b", "action": "left"},
        ...                   {"observation": "c", "action": "left"}],
        ...       "final_observation": "d", "num_steps": 4, "truncated": True}
        >>> print(episode_digest(ep))
        Actions (3, 1 invalid left out): up; left; left
        Last observation: d
        >>> episode_digest(ep, outcome=True, sep=" | ", max_chars=60)
        'Episode was cut off after 4 steps. | Actions (3, 1 invali...'
    """
    records = episode.get("records") or []
    actions = [str(r.get("action", ""))[: max_chars + 1] for r in records]
    valid = [a for a in actions if not a.startswith(_INVALID)]
    entries = valid
    skipped = len(actions) - len(valid)
    first = int(episode.get("first_step", 1) or 1)
    notes = []
    if skipped:
        notes.append(f"{skipped} invalid left out")
    if first > 1:
        notes.append(f"steps 1-{first - 1} not kept")
    head = f"Actions ({len(valid)}{', ' + ', '.join(notes) if notes else ''}): "
    if len(entries) > max_actions:
        k = max_actions // 2
        more = f"... {len(entries) - 2 * k} more ..."
        entries = [*entries[:k], more, *entries[len(entries) - k :]]
    lines = [head + "; ".join(entries)]
    if outcome:
        n = episode.get("num_steps", len(records))
        lines.insert(0, f"Episode {episode_outcome(episode)} after {n} steps.")
    final = episode.get("final_observation")
    if obs_chars > 0 and final:
        lines.append("Last observation: " + clip(str(final).strip(), obs_chars))
    return clip(sep.join(lines), max_chars)
