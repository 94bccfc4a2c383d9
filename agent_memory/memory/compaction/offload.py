"""Offloading large observations (:class:`~agent_memory.memory.compaction.CompactionMemory`).

An observation longer than a limit is rendered as a short preview with an id (``[obs#3
offloaded: 2,048 chars; preview: ...]``) by a :func:`previewing` copy of the formatter; records
keep the full text, and an :class:`Offloads` store returns it by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_memory.formatting import Formatter

__all__ = ["Offloads", "offload_id", "offload_preview", "previewing"]


def offload_id(step: int) -> str:
    """The id an offloaded observation of ``step`` is loaded back by."""
    return f"obs#{step}"


def offload_preview(step: int, text: str, chars: int) -> str:
    """What the prompt shows instead of ``text``: its id, size and first ``chars`` characters.

    Example:
        >>> offload_preview(3, "A very   long\\nlog " * 200, 12)
        '[obs#3 offloaded: 3,600 chars; preview: A very lon ...]'
    """
    head = " ".join(text[:chars].split())
    return f"[{offload_id(step)} offloaded: {len(text):,} chars; preview: {head} ...]"


class Offloads(dict[int, str]):
    """One env's offloaded observations: step -> full text, oldest first.

    Example:
        >>> store = Offloads()
        >>> for step in (2, 5, 7):
        ...     store.add(step, f"text {step}", capacity=2)
        >>> store.ids(), store.load("obs#5"), store.load(7)
        (['obs#5', 'obs#7'], 'text 5', 'text 7')
    """

    def add(self, step: int, text: str, capacity: int | None = None) -> None:
        """Keep ``text`` as step ``step``'s observation (the oldest goes beyond ``capacity``)."""
        self[step] = text
        if capacity is not None and len(self) > capacity:
            del self[next(iter(self))]

    def ids(self) -> list[str]:
        """Ids of the held observations, oldest first."""
        return [offload_id(s) for s in self]

    def load(self, obs_id: str | int, env_id: int = 0) -> str:
        """The full text by id (``"obs#3"``) or step number.

        Raises:
            KeyError: no such offloaded observation (the message lists the held ids).
        """
        step: Any = obs_id
        if isinstance(obs_id, str):
            text = obs_id[4:] if obs_id.startswith("obs#") else obs_id
            step = int(text) if text.isdigit() else -1
        if not isinstance(step, int) or step not in self:
            raise KeyError(
                f"env {env_id} has no offloaded observation {obs_id!r}: held ids are "
                f"{self.ids()} (ids are per episode; evicted beyond offload_capacity)"
            )
        return self[step]


class _Previewing(Formatter):
    """Put before a formatter's class ``_own`` by :func:`previewing`: renders previews."""

    _own: type[Formatter]
    offload_key: str
    offload_limit: int
    offload_chars: int
    #: The formatter's own ``render_batch`` is the default, which calls ``render`` per step.
    _batch_calls_render: bool

    def _shown(self, text: Any, step: int) -> Any:
        # A preview is never previewed again (a render_batch may call render).
        mark = f"[{offload_id(step)} offloaded: "
        if isinstance(text, str) and len(text) > self.offload_limit and not text.startswith(mark):
            return offload_preview(step, text, self.offload_chars)
        return text

    def render(self, record: Mapping[str, Any], step: int) -> Any:
        key = self.offload_key
        if key in record:
            record = {**record, key: self._shown(record[key], step)}
        return self._own.render(self, record, step)

    def render_batch(self, columns: Mapping[str, Sequence[Any]], steps: Sequence[int]) -> list[Any]:
        column = None if self._batch_calls_render else columns.get(self.offload_key)
        limit = self.offload_limit
        if column is not None and any(isinstance(o, str) and len(o) > limit for o in column):
            shown = [self._shown(o, s) for o, s in zip(column, steps, strict=True)]
            columns = {**columns, self.offload_key: shown}
        return self._own.render_batch(self, columns, steps)

    def __reduce__(self) -> tuple[Any, ...]:
        # The class is made at run time: pickle the formatter it wraps and the limits.
        inner: Formatter = object.__new__(self._own)
        own = {k: v for k, v in self.__dict__.items() if not k.startswith("offload_")}
        inner.__dict__.update(own)
        return previewing, (inner, self.offload_limit, self.offload_chars)


_CLASSES: dict[type, type] = {}


def previewing(formatter: Formatter, limit: int, chars: int) -> Formatter:
    """A copy of ``formatter`` that renders an observation (its ``obs_key``) longer than
    ``limit`` characters as its preview (:func:`offload_preview` of the first ``chars``).

    The copy's class subclasses the formatter's own, so all else is unchanged (``spec`` too).

    Example:
        >>> from agent_memory.formatting import make_formatter
        >>> simple = make_formatter("simple")
        >>> fmt = previewing(simple, limit=10, chars=6)
        >>> fmt.render({"observation": "a very long log line", "action": "read"}, 3)
        "[Observation 3: '[obs#3 offloaded: 20 chars; preview: a very ...]', Action 3: 'read']"
        >>> fmt.spec() == simple.spec(), isinstance(fmt, type(simple)), fmt.obs_key
        (True, True, 'observation')
    """
    own = type(formatter)
    cls = _CLASSES.get(own)
    if cls is None:
        batch_calls_render = own.render_batch is Formatter.render_batch
        cls = type(
            f"Previewing{own.__name__}",
            (_Previewing, own),
            {"_own": own, "_batch_calls_render": batch_calls_render, "__module__": __name__},
        )
        _CLASSES[own] = cls
    fmt: _Previewing = object.__new__(cls)
    fmt.__dict__.update(formatter.__dict__)
    fmt.offload_key = getattr(formatter, "obs_key", "observation")
    fmt.offload_limit = limit
    fmt.offload_chars = min(chars, limit)
    return fmt
