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
    >>> override_value([5, 5]), override_value(True), override_value("a b"), override_value("3")
    ('[5,5]', 'true', "'a b'", "'3'")
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["close_matches", "did_you_mean", "override_value"]


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


#: Words Hydra's override grammar reads as another type than str.
_WORDS = frozenset({"null", "true", "false", "inf", "nan"})
#: A string Hydra's override grammar reads back as the same string, unquoted.
_PLAIN = re.compile(r"[A-Za-z_/.][\w./:-]*")


def override_value(value: Any) -> str:
    """``value`` as a command-line override writes it, so that Hydra reads back the same value:
    ``null``, ``true``, ``3``, ``[5,5]``, ``{k:v}``, and a string bare when it reads back as
    that string, else quoted (``'a b'``, ``'3'``, ``'null'``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        bare = _PLAIN.fullmatch(value) and value.lower() not in _WORDS
        return value if bare else "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    return str(value)
