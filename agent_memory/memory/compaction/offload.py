"""Offloading large observations (:class:`~agent_memory.memory.compaction.CompactionMemory`).

An observation longer than a limit is shown in the prompt as a short preview with an id
(``[obs#3 offloaded: 2,048 chars; preview: ...]``): the memory renders its steps through a
:class:`PreviewFormatter`, so the records keep the full text and only the rendering (what a
prompt shows and what tokens are counted on) has the preview. The full texts are also kept per
env in an :class:`Offloads` store keyed by step number, and returned by id on request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_memory.formatting import Formatter

__all__ = ["Offloads", "PreviewFormatter", "offload_id", "offload_preview"]


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


class PreviewFormatter(Formatter):
    """Renders like ``inner``, but an observation (``inner.obs_key``) longer than ``limit``
    characters as its preview (:func:`offload_preview` of its first ``chars`` characters). All
    else (joining, token texts, :meth:`spec`, settings such as ``obs_key``) is ``inner``'s, so a
    saved state's renderings compare equal to those of the bare formatter.

    Example:
        >>> from agent_memory.formatting import make_formatter
        >>> fmt = PreviewFormatter(make_formatter("simple"), limit=10, chars=6)
        >>> fmt.render({"observation": "a very long log line", "action": "read"}, 3)
        "[Observation 3: '[obs#3 offloaded: 20 chars; preview: a very ...]', Action 3: 'read']"
        >>> fmt.spec() == make_formatter("simple").spec(), fmt.obs_key
        (True, 'observation')
    """

    def __init__(self, inner: Formatter, limit: int, chars: int) -> None:
        super().__init__()
        self.inner, self.limit, self.chars = inner, limit, min(chars, limit)
        self.key = getattr(inner, "obs_key", "observation")
        # Instance attributes: what the memory reads of a formatter is the inner one's.
        self.output = inner.output  # type: ignore[misc]
        self.separator = inner.separator

    def _shown(self, text: Any, step: int) -> Any:
        if isinstance(text, str) and len(text) > self.limit:
            return offload_preview(step, text, self.chars)
        return text

    def render(self, record: Mapping[str, Any], step: int) -> Any:
        if self.key in record:
            record = {**record, self.key: self._shown(record[self.key], step)}
        return self.inner.render(record, step)

    def render_batch(self, columns: Mapping[str, Sequence[Any]], steps: Sequence[int]) -> list[Any]:
        column = columns.get(self.key)
        limit = self.limit
        if column is not None and any(isinstance(o, str) and len(o) > limit for o in column):
            shown = [self._shown(o, s) for o, s in zip(column, steps, strict=True)]
            columns = {**columns, self.key: shown}
        return self.inner.render_batch(columns, steps)

    def join(self, rendered: Sequence[Any]) -> Any:
        return self.inner.join(rendered)

    def empty(self) -> Any:
        return self.inner.empty()

    def text_of(self, rendered: Any) -> str:
        return self.inner.text_of(rendered)

    def texts_of(self, rendered: Sequence[Any]) -> list[str]:
        return self.inner.texts_of(rendered)

    def spec(self) -> dict[str, Any]:
        return self.inner.spec()

    def __getattr__(self, name: str) -> Any:
        # Settings of the inner formatter (obs_key, action_key, required_keys, ...).
        if name == "inner":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PreviewFormatter({self.inner!r}, limit={self.limit}, chars={self.chars})"
