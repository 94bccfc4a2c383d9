"""Nearest valid names for a misspelled one: what turns "unknown key" into "did you mean ...?".

Config keys, constructor parameters, registered names and template fields all use these, so a
typo gets the same kind of answer wherever it is made.

Example:
    >>> close_matches("group_sise", ["num_groups", "group_size", "num_workers"])
    ['group_size']
    >>> did_you_mean("group_sise", ["group_size", "seed"], prefix="rollout.")
    'did you mean rollout.group_size?'
    >>> did_you_mean("xyz", ["group_size"])
    ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["close_matches", "did_you_mean"]


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``candidates`` closest to ``name``, best first: one that differs only in
    case, then difflib's ratio >= 0.6 and within 0.1 of the best (a clear winner comes alone)."""
    pool = sorted({str(c) for c in candidates})
    same = [c for c in pool if c.lower() == name.lower() and c != name]
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, c).ratio(), c) for c in pool if c not in same),
        key=lambda t: -t[0],
    )
    best = scored[0][0] if scored else 0.0
    rest = [c for r, c in scored if r >= 0.6 and r >= best - 0.1]
    return (same + rest)[:n]


def did_you_mean(
    name: str, candidates: Iterable[str], *, prefix: str = "", suffix: str = ""
) -> str:
    """``"did you mean <prefix><match><suffix>?"`` for the closest candidates, or ``""``
    (``prefix`` / ``suffix`` turn a name into what to type, e.g. ``"memory.params."``, ``"=3"``)."""
    found = close_matches(name, candidates)
    if not found:
        return ""
    return "did you mean " + " or ".join(f"{prefix}{m}{suffix}" for m in found) + "?"
