"""A ``store()`` record checked: its columns (one value per env each) and its keys against each
env's episode keys (fixed by the episode's first store). Every strategy that stores records
shares these (:mod:`agent_memory.memory.base` re-exports them).

Example:
    >>> record_columns({"observation": ["a"], "action": ["x"]}, 1)["observation"]
    ['a']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["check_record_keys", "record_columns"]


def record_columns(record: Any, n: int) -> dict[str, Sequence[Any]]:
    """Validate a ``store()`` record: a non-empty mapping of key -> ``n`` per-env values.

    Example:
        >>> record_columns({"observation": ["a", "b"], "action": ["x", "y"]}, 2)["action"]
        ['x', 'y']
    """
    if not isinstance(record, Mapping) or not record:
        raise TypeError(
            "record must be a non-empty mapping key -> one value per env, "
            f"got {type(record).__name__} {record!r:.80}"
        )
    for k, v in record.items():
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
            raise TypeError(
                f"record[{k!r}] must be a sequence with one value per env, got "
                f"{type(v).__name__}; wrap a single env's value in a list"
            )
        if len(v) != n:
            raise ValueError(
                f"record[{k!r}] has {len(v)} values, expected {n} (one per env in env_ids)"
            )
    return dict(record)


def check_record_keys(
    keys: tuple[str, ...],
    episode_keys: Sequence[tuple[str, ...] | None],
    ids: Sequence[int],
    formatter: Any,
) -> set[tuple[str, ...] | None]:
    """Check a record's ``keys`` against the ``episode_keys`` (None before an episode's first
    store) of the envs in ``ids``; keys in another order are accepted. Returns the distinct
    episode key tuples of ``ids`` (``== {keys}``: nothing to reorder or fix).

    Raises:
        ValueError: the formatter's required keys are missing, or the keys differ from an env's.
    """
    seen = {episode_keys[i] for i in ids}
    if seen == {keys}:  # every env is mid-episode with these keys: nothing to check
        return seen
    if None in seen:
        required: frozenset[str] = getattr(formatter, "required_keys", frozenset())
        if not required <= set(keys):
            raise ValueError(
                f"the {formatter.spec()['name']!r} formatter needs record keys "
                f"{sorted(required)}, got {sorted(keys)}; missing "
                f"{sorted(required - set(keys))} (set the formatter's obs_key/action_key)"
            )
    key_set = frozenset(keys)
    for ep in seen - {None, keys}:
        assert ep is not None
        if frozenset(ep) != key_set:
            i = next(i for i in ids if episode_keys[i] == ep)
            raise ValueError(
                f"record keys differ from env {i}'s episode keys {sorted(ep)}: missing "
                f"{sorted(set(ep) - key_set)}, unexpected {sorted(key_set - set(ep))} "
                "(an episode's keys are fixed by its first store; reset the env to "
                "change them)"
            )
    return seen
