"""Dataclasses that pickle as their field values, in order.

A rollout pickles a step record and a generation per env-step, twice (worker and driver).
:func:`by_position` makes a class pickle as the tuple of its values, rebuilt through its own
constructor: cheaper both ways than Python's default ``__dict__`` pickling.

Example:
    >>> import pickle
    >>> from agent_memory.protocol import Generation  # decorated with by_position
    >>> g = Generation("<action>up</action>", policy_version=3)
    >>> cls, values = g.__reduce__()
    >>> cls.__name__, values[:6]  # the field values, in order
    ('Generation', ('<action>up</action>', None, None, None, None, 3))
    >>> pickle.loads(pickle.dumps(g)) == g
    True
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

__all__ = ["by_position"]

T = TypeVar("T")


def by_position(cls: type[T]) -> type[T]:
    """Class decorator for a dataclass: its instances pickle (and copy) as ``cls(*values)``.

    The class's constructor runs on unpickling (``__post_init__`` checks included), so every
    field must be an ``__init__`` argument that can be passed by position.

    Raises:
        TypeError: ``cls`` is not a dataclass, or has a field that is not a positional
            ``__init__`` argument.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"by_position expects a dataclass, got {cls!r}")
    fields = dataclasses.fields(cls)
    bad = [f.name for f in fields if not f.init or f.kw_only]
    if bad:
        raise TypeError(
            f"by_position needs every field of {cls.__name__} to be a positional __init__ "
            f"argument: expected init=True and kw_only=False, got {bad}"
        )
    names = [f.name for f in fields]
    # attrgetter of one name returns the value, not a 1-tuple.
    get = attrgetter(*names) if len(names) > 1 else (lambda obj: (getattr(obj, names[0]),))

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), get(self))

    patched: Any = cls  # the class as a plain object: the decorator replaces one of its methods
    patched.__reduce__ = __reduce__
    return cls
