"""What the vector wrapper relies on about Gymnasium's vector envs (1.4): their autoreset mode,
their ``key`` / ``_key`` info convention, and two bugs it works around or refuses.

Example:
    >>> import numpy as np
    >>> info = {"won": np.array([False, True]), "_won": np.array([False, True])}
    >>> info_at(info, 0), info_at(info, 1)
    ({}, {'won': True})
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.logger import warn
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, VectorEnv, async_vector_env

from agent_memory.protocol import ADMISSIBLE_ACTIONS, INVALID_REASON, IS_ACTION_VALID, TASK, WON
from agent_memory.tool_actions import PARALLEL_TOOL_CALLS, TOOLS

__all__ = [
    "STEP_KEYS",
    "async_worker_keeps_autoreset",
    "autoreset_mode_of",
    "env_value",
    "env_values",
    "info_at",
    "infos_at",
    "refuse_text_on_shared_memory",
]

#: The info keys the wrapper reads per env (the rest of the info passes through untouched);
#: a step's info is read for all but the task (read when an episode starts).
STEP_KEYS = (ADMISSIBLE_ACTIONS, IS_ACTION_VALID, INVALID_REASON, WON, TOOLS, PARALLEL_TOOL_CALLS)
_WANTED = (TASK, *STEP_KEYS)


_ABSENT = object()


def env_value(info: Mapping[str, Any], key: str, i: int, default: Any = None) -> Any:
    """Env ``i``'s value of ``key`` in a vector info dict (Gymnasium's ``key`` / ``_key``
    convention: absent where the mask says so); numpy scalars come back as Python ones.

    Example:
        >>> import numpy as np
        >>> info = {"won": np.array([True, False]), "_won": np.array([True, False])}
        >>> env_value(info, "won", 0), env_value(info, "won", 1, "n/a")
        (True, 'n/a')
    """
    return env_values(info, key, [i], default)[0]


def env_values(
    info: Mapping[str, Any], key: str, ids: Sequence[int] | np.ndarray, default: Any = None
) -> list[Any]:
    """:func:`env_value` for every env of ``ids`` (the key's array and mask are read once).

    Example:
        >>> import numpy as np
        >>> info = {"won": np.array([True, False, True]), "_won": np.array([True, False, True])}
        >>> env_values(info, "won", [2, 1, 0], "n/a")
        [True, 'n/a', True]
    """
    value = info.get(key)
    if value is None:
        return [default] * len(ids)
    mask = info.get(f"_{key}")
    if len(ids) <= _FEW:  # the asynchronous engine's common case: 1 or 2 acting envs
        return _few_values(value, mask, ids, default)
    # Only the entries of ``ids`` are read: the cost follows them, not the batch.
    at = ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.intp)
    if isinstance(mask, np.ndarray):
        flags = mask[at].tolist()
    else:
        flags = None if mask is None else [mask[i] for i in ids]
    if flags is not None and all(flags):  # every env of ids has it
        flags = None
    if isinstance(value, np.ndarray) and value.ndim == 1:
        items = _items(value, at)
        if flags is None:
            return items
        return [item if flag else default for item, flag in zip(items, flags, strict=True)]
    if flags is None:
        return [_python(value[i]) for i in ids]
    return [_python(value[i]) if flag else default for i, flag in zip(ids, flags, strict=True)]


#: Up to this many envs, :func:`env_values` reads each one's entry as a scalar: numpy's index
#: arrays cost more (about 3 µs a key, against 1-2 µs for one env; measured with ``timeit``).
_FEW = 2


def _items(value: np.ndarray, at: np.ndarray) -> list[Any]:
    """The entries ``at`` of a 1-d array as Python values (an object array's objects as they
    are, its numpy scalars made Python ones)."""
    items = value[at].tolist()  # Python scalars, as .item() gives
    if value.dtype == object:
        generic = np.generic
        items = [x.item() if isinstance(x, generic) else x for x in items]
    return items


def _few_values(value: Any, mask: Any, ids: Sequence[int] | np.ndarray, default: Any) -> list[Any]:
    """:func:`env_values` read entry by entry (for a few ``ids``)."""
    if mask is None:
        return [_python(value[i]) for i in ids]
    return [_python(value[i]) if mask[i] else default for i in ids]


def _python(item: Any) -> Any:
    return item.item() if isinstance(item, np.generic) else item


def info_at(info: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s values of the keys the wrapper reads from a vector info dict (Gymnasium's
    ``key`` / ``_key`` convention)."""
    return infos_at(info, [i])[0]


def infos_at(
    info: Mapping[str, Any], ids: Sequence[int], keys: Sequence[str] = _WANTED
) -> list[dict[str, Any]]:
    """:func:`info_at` for every env of ``ids``, in that order (``keys``: those to read)."""
    out: list[dict[str, Any]] = [{} for _ in ids]
    at = np.asarray(ids, dtype=np.intp)  # the index array of every key's read
    for key in keys:
        if key not in info:
            continue
        for d, value in zip(out, env_values(info, key, at, _ABSENT), strict=True):
            if value is not _ABSENT:
                d[key] = value
    return out


def autoreset_mode_of(env: VectorEnv) -> AutoresetMode:
    """The vector env's autoreset mode (NEXT_STEP, Gymnasium's default, when it declares none).

    Raises:
        ValueError: an unknown mode in ``env.metadata``.
    """
    mode = env.metadata.get("autoreset_mode")
    if mode is None:
        warn(
            f"{env} has no 'autoreset_mode' in its metadata: VectorHistoryWrapper assumes "
            "AutoresetMode.NEXT_STEP (Gymnasium's default)"
        )
        return AutoresetMode.NEXT_STEP
    try:
        return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)
    except ValueError:
        raise ValueError(
            f"unknown autoreset_mode {mode!r} in env.metadata: expected one of "
            f"{[m.value for m in AutoresetMode]}"
        ) from None


def _has_text(space: spaces.Space) -> bool:
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, spaces.Dict):
        return any(_has_text(s) for s in space.spaces.values())
    return isinstance(space, spaces.Tuple) and any(_has_text(s) for s in space.spaces)


def refuse_text_on_shared_memory(env: VectorEnv) -> None:
    """Refuse an AsyncVectorEnv that puts Text observations in shared memory.

    Raises:
        ValueError: it would return stale ``'000...'`` observations (Gymnasium 1.4).
    """
    inner = env.unwrapped
    if (
        isinstance(inner, AsyncVectorEnv)
        and getattr(inner, "shared_memory", False)
        and _has_text(env.single_observation_space)
    ):
        raise ValueError(
            "AsyncVectorEnv with shared_memory=True returns stale '000...' observations "
            "for Text spaces (Gymnasium 1.4): build it with shared_memory=False, e.g. "
            "gym.make_vec(id, n, vectorization_mode='async', "
            "vector_kwargs={'shared_memory': False})"
        )


@functools.cache
def async_worker_keeps_autoreset() -> bool:
    """Whether Gymnasium's AsyncVectorEnv worker keeps a pending autoreset across ``reset`` when
    it has no shared memory (the Gymnasium 1.4 bug). Read from the worker's source, so a fixed
    Gymnasium turns the workaround off by itself."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(async_vector_env._async_worker)))
    except (OSError, TypeError, SyntaxError):
        return True  # cannot tell: assume the behaviour of the pinned Gymnasium 1.4
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and any(
                isinstance(c, ast.Constant) and c.value == "reset" for c in node.test.comparators
            )
        ):
            # Fixed when the reset branch itself (not a nested `if shared_memory:`) clears it.
            return not any(
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "autoreset" for t in stmt.targets)
                for stmt in node.body
            )
    return True
