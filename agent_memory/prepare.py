"""``prepare_env``: an env's one-off set-up, run by the driver before any worker builds the env.

Some envs need assets before their first episode (TextWorld generates its games); inside the Ray
workers that work would not show. An env class with a ``prepare(*, progress, **kwargs)``
classmethod (or a factory function with such an attribute) gets it called here, with the kwargs
the workers will pass to ``gymnasium.make``.

Example:
    >>> prepare_env("agent_memory/Recall-v0", {"num_distractors": 2})  # nothing to prepare
    False
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["entry_point", "prepare_env"]


def entry_point(env_id: str) -> Any:
    """The class (or factory) registered as ``env_id`` (``"module:Env-v0"`` imports ``module``).

    Example:
        >>> entry_point("agent_memory/Recall-v0").__name__
        'RecallEnv'
    """
    import gymnasium as gym

    import agent_memory.envs  # noqa: F401  (registers the bundled ids)

    module, sep, name = env_id.rpartition(":")
    if sep:  # "package.module:Env-v0", as gymnasium.make takes it: the module registers the id
        importlib.import_module(module)
        env_id = name
    entry = gym.spec(env_id).entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry


def prepare_env(
    env_id: str, kwargs: Mapping[str, Any] | None = None, *, progress: bool = True
) -> bool:
    """Run the env's ``prepare`` with ``kwargs`` if it has one; True when it had.

    Args:
        env_id: the registered Gymnasium id the workers will make.
        kwargs: the keyword arguments they will pass to ``gymnasium.make``.
        progress: let the set-up show a progress bar (on stderr).

    Raises:
        Whatever the env's own checks raise for bad ``kwargs``, before any worker starts.
    """
    entry = entry_point(env_id)
    hook = inspect.getattr_static(entry, "prepare", None)
    if isinstance(entry, type) and not isinstance(hook, classmethod | staticmethod):
        return False  # none, or an instance method that happens to be called so
    prepare = getattr(entry, "prepare", None)
    if not callable(prepare):
        return False
    prepare(progress=progress, **dict(kwargs or {}))
    return True
