"""The one home of the project's argument checks: every module validates with these, so the same
mistake gets the same message wherever it is made ("expected X, got Y").

Numbers are always finite (NaN and inf are refused), bools are never ints.

Example:
    >>> check_int("top_k", 3, 0), check_number("temperature", 0.7, low=0)
    (3, 0.7)
    >>> check_number("top_p", float("nan"), low=0, high=1, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be a number in (0, 1], got nan
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

__all__ = [
    "bounded_capacity",
    "check_choice",
    "check_history_length",
    "check_int",
    "check_number",
    "check_stop",
    "check_str",
    "is_int",
    "is_number",
]


def is_int(value: Any) -> bool:
    """An int (numpy ints included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """A finite int or float (numpy scalars included), not a bool."""
    if type(value) is float or type(value) is int:  # the common case, without the ABCs
        return math.isfinite(value)
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    )


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices``.

    Example:
        >>> check_choice("mode", "chat", ("chat", "completion"))
        'chat'
        >>> check_choice("mode", "text", ("chat", "completion"))
        Traceback (most recent call last):
        ...
        ValueError: mode must be one of ['chat', 'completion'], got 'text'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_history_length(history_length: int) -> int:
    """``history_length``: 0 = no history, -1 = the whole episode, k > 0 = the last k steps.

    Example:
        >>> check_history_length(-2)
        Traceback (most recent call last):
        ...
        ValueError: history_length must be -1 (whole episode), 0 (none) or k > 0 (last k steps), ...
    """
    if not is_int(history_length) or history_length < -1:
        raise ValueError(
            "history_length must be -1 (whole episode), 0 (none) or k > 0 (last k steps), "
            f"got {history_length!r}"
        )
    return int(history_length)


def bounded_capacity(history_length: int, bounded: bool) -> int | None:
    """Steps a memory keeps per env: None (whole episodes) unless ``bounded``, then the window
    ``history_length`` (at least 1); the wrappers' options and the job config both ask here.

    Example:
        >>> bounded_capacity(5, False), bounded_capacity(5, True), bounded_capacity(0, True)
        (None, 5, 1)
        >>> bounded_capacity(-1, True)
        Traceback (most recent call last):
        ...
        ValueError: bounded=True keeps only history_length steps per env, but history_length=-1 ...
    """
    if not bounded:
        return None
    if history_length == -1:
        raise ValueError(
            "bounded=True keeps only history_length steps per env, but history_length=-1 "
            "asks for whole episodes: set bounded=False or a window (history_length=k)"
        )
    return max(1, history_length)


def check_int(name: str, value: Any, low: int, hint: str = "", *, allow_none: bool = False) -> Any:
    """``value`` as an int >= ``low`` (bools refused), or None when ``allow_none``; ``hint``
    follows the bound in the error (why it is the bound).

    Example:
        >>> check_int("top_k", 3, 0), check_int("capacity", None, 1, allow_none=True)
        (3, None)
        >>> check_int("top_k", -1, 0)
        Traceback (most recent call last):
        ...
        ValueError: top_k must be an int >= 0, got -1
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value < low:
        none = "None or " if allow_none else ""
        raise ValueError(f"{name} must be {none}an int >= {low}{hint}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a float in ``[low, high]`` (``(low, ...`` when ``low_open``, ``..., high)``
    when ``high_open``; no upper bound when ``high`` is None; bools, NaN and inf refused), or
    None when ``allow_none``.

    Example:
        >>> check_number("rerank_weight", 1, low=0, high=1)
        1.0
        >>> check_number("trigger_ratio", 0, low=0, high=1, low_open=True, allow_none=True)
        Traceback (most recent call last):
        ...
        ValueError: trigger_ratio must be None or a number in (0, 1], got 0
        >>> check_number("notes_from", 1, low=0, high=1, high_open=True)
        Traceback (most recent call last):
        ...
        ValueError: notes_from must be a number in [0, 1), got 1
    """
    if value is None and allow_none:
        return None
    if (
        not is_number(value)
        or not (value > low if low_open else value >= low)
        or (high is not None and not (value < high if high_open else value <= high))
    ):
        if high is None:
            bound = f"> {low}" if low_open else f">= {low}"
        else:
            bound = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        none = "None or " if allow_none else ""
        raise ValueError(f"{name} must be {none}a number {bound}, got {value!r}")
    return float(value)


def check_stop(stop: str | Sequence[str] | None) -> list[str] | None:
    """Stop strings as a list: one string or a non-empty list of non-empty ones, or None.

    Example:
        >>> check_stop("</action>"), check_stop(None)
        (['</action>'], None)
        >>> check_stop([""])
        Traceback (most recent call last):
        ...
        ValueError: stop must be a non-empty string or a list of them, got ['']
    """
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not stops or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a non-empty string or a list of them, got {stops!r}")
    return stops


def check_str(name: str, value: Any, *, empty: bool = False) -> str:
    """``value`` if it is a str (a non-empty one unless ``empty``).

    Example:
        >>> check_str("window_header", "", empty=True)
        ''
        >>> check_str("header", "")
        Traceback (most recent call last):
        ...
        ValueError: header must be a non-empty str, got ''
    """
    if not isinstance(value, str) or not (value or empty):
        raise ValueError(f"{name} must be a{'' if empty else ' non-empty'} str, got {value!r}")
    return value
