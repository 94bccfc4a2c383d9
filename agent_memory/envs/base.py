"""What every bundled text environment shares: Text spaces, the ``info`` contract, stable hashes.

Observations and actions are ``str`` (the wrappers parse the LLM's raw output first). ``reset``
and every ``step`` put ``admissible_actions`` (omitted where not finite), ``won``, ``state_key`` (a
stable hash of the true state: equal states, equal keys, for GiGPO) and ``task`` in ``info``;
``step`` adds ``is_action_valid`` and ``invalid_reason``: an unknown action never raises and
leaves the state unchanged. ``oracle_action()`` on the unwrapped env returns an expert's action.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any, Final

from gymnasium import spaces

from agent_memory.protocol import (
    ADMISSIBLE_ACTIONS,
    INVALID_REASON,
    IS_ACTION_VALID,
    STATE_KEY,
    TASK,
    WON,
)

#: Characters an observation or action may hold: printable ASCII plus the few non-ASCII symbols the
#: bundled envs print (Sokoban's box-on-target, typographic quotes and dashes in generated text).
CHARSET: Final[str] = string.printable + "√…‘’“”–—•·°×é"
_CHARSET_SET: Final[frozenset[str]] = frozenset(CHARSET)

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "CHARSET",
    "INVALID_REASON",
    "IS_ACTION_VALID",
    "STATE_KEY",
    "TASK",
    "WON",
    "sanitize",
    "stable_hash",
    "text_space",
]


def text_space(max_length: int) -> spaces.Text:
    """A ``Text`` space that Gymnasium's ``check_env`` accepts for real text.

    Gymnasium's defaults (``min_length=1``, alphanumeric charset) reject spaces, punctuation and
    newlines, so every bundled env declares its spaces through this function.

    Example:
        >>> space = text_space(64)
        >>> space.contains("You see a box.\\nActions: up, down"), space.contains("")
        (True, True)
    """
    return spaces.Text(max_length, min_length=0, charset=CHARSET)


def collapse_spaces(text: str, max_chars: int | None = None) -> str:
    """``" ".join(text.split())``, cut to ``max_chars`` characters, reading only the words the
    cut keeps: how the envs match a (possibly megabyte) action against short names.

    Example:
        >>> collapse_spaces("  Pick   UP "), collapse_spaces("  Pick   UP " * 10**5, 8)
        ('Pick UP', 'Pick UP ')
    """
    if max_chars is None:
        return " ".join(text.split())
    # max_chars // 2 + 1 words (of one character or more, one space apart) make max_chars
    # characters at least; split stops after them (the rest stays one piece, uncut).
    k = max_chars // 2 + 1
    return " ".join(text.split(None, k)[:k])[:max_chars]


def sanitize(text: str, max_length: int | None = None) -> str:
    r"""Make ``text`` a member of :func:`text_space`: escape foreign characters, cap the length.

    Characters outside :data:`CHARSET` become ``\\uXXXX`` escapes (so nothing is silently dropped);
    text over ``max_length`` keeps its head and ends with ``"..."``.

    Example:
        >>> sanitize("naïve → ok")
        'na\\xefve \\u2192 ok'
        >>> sanitize("abcdefghij", max_length=8)
        'abcde...'
    """
    if max_length is not None and len(text) > max_length + 1:
        # Escapes only lengthen text: the first max_length + 1 characters decide the result.
        text = text[: max_length + 1]
    if not _CHARSET_SET.issuperset(text):
        text = "".join(
            c if c in _CHARSET_SET else c.encode("unicode_escape").decode("ascii") for c in text
        )
    if max_length is not None and len(text) > max_length:
        text = text[: max(0, max_length - 3)] + "..."
    return text


def stable_hash(*parts: Any) -> str:
    """A hex digest of ``repr(parts)`` that is equal across processes (unlike ``hash()``).

    Example:
        >>> stable_hash("room", (1, 2)) == stable_hash("room", (1, 2))
        True
        >>> len(stable_hash("x"))
        16
    """
    return hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).hexdigest()
