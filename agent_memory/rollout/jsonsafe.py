"""Values a rollout writes, made safe for JSON and Arrow whatever the model or env produced.

Text is capped (its full length kept), lone surrogates become ``?``, non-strings are written as
their ``repr`` and non-finite floats as ``null`` (counted), so no value costs a run its outputs.

Example:
    >>> capped_text("<think>\\ud83d</think>", max_chars=100)
    ('<think>?</think>', 16)
    >>> capped_text(b"up", max_chars=100), capped_text("x" * 10, max_chars=4)
    (("b'up'", 5), ('xxxx', 10))
    >>> counts = {}
    >>> jsonable({"reward": float("nan"), "ids": (1, 2)}, counts), counts
    ({'reward': None, 'ids': [1, 2]}, {'nonfinite': 1})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from agent_memory.text import utf8_safe

__all__ = ["capped_text", "jsonable"]


def capped_text(value: Any, max_chars: int) -> tuple[str, int]:
    """``value`` as valid text of at most ``max_chars`` characters, and its full length (the
    ``repr`` of a non-string: bytes, numbers, dicts, None)."""
    text = value if isinstance(value, str) else repr(value)
    return utf8_safe(text[:max_chars]), len(text)


def jsonable(value: Any, counts: dict[str, int] | None = None) -> Any:
    """``value`` with every part JSON can hold exactly as it is, and the rest made so: valid
    text, ``null`` for NaN/inf (counted in ``counts["nonfinite"]``), plain numbers for numpy
    scalars, lists for tuples and arrays, ``repr`` for anything else."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if counts is not None:
            counts["nonfinite"] = counts.get("nonfinite", 0) + 1
        return None
    if isinstance(value, np.generic):
        return jsonable(value.item(), counts)
    if isinstance(value, Mapping):
        return {utf8_safe(str(k)): jsonable(v, counts) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v, counts) for v in value]
    return utf8_safe(repr(value))
