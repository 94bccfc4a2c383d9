"""``resolve_env``: what ``env.id`` and ``env.kwargs`` resolve to, found without building the env.

Shared by :mod:`~agent_memory.rollout.driver.preflight` and
:mod:`~agent_memory.rollout.driver.oracle_check` (its own module: neither imports the other).

Example:
    >>> from agent_memory.config import EnvConfig
    >>> env = resolve_env(EnvConfig(id="agent_memory/Recall-v0", kwargs={"num_choices": 3}))
    >>> env.id, env.env_class.__name__, env.kwargs["num_choices"]
    ('agent_memory/Recall-v0', 'RecallEnv', 3)
"""

from __future__ import annotations

import importlib
import inspect
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_memory.config import ConfigError, EnvConfig
from agent_memory.signatures import bind_params
from agent_memory.suggest import did_you_mean

__all__ = ["MAKE_KWARGS", "EnvCheck", "build_env", "qualname", "resolve_env"]

log = logging.getLogger(__name__)

#: ``gym.make``'s own keyword arguments: ``make`` takes them, the env constructor never sees them.
MAKE_KWARGS = ("max_episode_steps", "disable_env_checker")


@dataclass
class EnvCheck:
    """What ``env.id`` resolves to, without building the env."""

    #: The registered id (without a ``module:`` prefix).
    id: str
    #: What ``gym.make`` calls: the env class or a factory function.
    entry_point: Callable[..., Any]
    #: The env class it makes: the entry point, or a factory's return annotation (None: unknown).
    env_class: type | None
    #: Keyword arguments the constructor gets (the spec's, then ``env.kwargs``).
    kwargs: dict[str, Any]


def resolve_env(env: EnvConfig) -> EnvCheck:
    """Look ``env.id`` up and bind ``env.kwargs`` to what it makes, without making it.

    Raises:
        ConfigError: an id that is not registered (or whose ``module:`` does not import), an
            entry point that does not import, or kwargs its constructor does not take.
    """
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import agent_memory.envs  # noqa: F401  (registers the bundled ids, as the workers do)

    module, sep, name = env.id.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except Exception as e:  # any failure to import is the user's module, reported as such
            raise ConfigError(
                f"env.id={env.id!r}: module {module!r} does not import ({type(e).__name__}: {e}); "
                "'module:Id' imports the module that registers Id: fix the module name in env.id, "
                "or pass a registered id, e.g. env.id=agent_memory/Sokoban-v0",
                key="env.id",
            ) from None
    try:
        spec = gym.spec(name)
    except gym.error.Error as e:
        bundled = sorted(i for i in gym.registry if i.startswith("agent_memory/"))
        hint = did_you_mean(name, gym.registry, prefix=f"env.id={module}{sep}")  # module kept
        fix = (
            f"pass a registered id (bundled: {', '.join(bundled)}; or choose a bundled env's "
            "config, e.g. env=sokoban), or 'module:Id' to import the module that registers Id"
        )
        raise ConfigError(
            f"env.id={env.id!r} is not a registered Gymnasium id ({e}): "
            + (f"{hint} Otherwise, {fix}" if hint else fix),
            key="env.id",
        ) from None
    entry = spec.entry_point
    try:
        creator = entry if callable(entry) else load_env_creator(str(entry))
    except Exception as e:
        raise ConfigError(
            f"env.id={env.id!r}: its entry point {entry!r} does not import "
            f"({type(e).__name__}: {e}): install what it needs, or choose another env.id",
            key="env.id",
        ) from None
    kwargs = {**spec.kwargs, **env.kwargs}
    if env.max_steps is not None and "max_episode_steps" in env.kwargs:
        raise ConfigError(
            "env.kwargs.max_episode_steps and env.max_steps both set the step limit: remove "
            "env.kwargs.max_episode_steps (env.max_steps is the config's step limit)",
            key="env.kwargs.max_episode_steps",
        )
    given = {k: v for k, v in kwargs.items() if k not in MAKE_KWARGS}
    where = f"env {spec.id!r} ({qualname(creator)})"
    bind_params(
        creator,
        given,
        key="env.kwargs",
        what=where,
        configured=env.kwargs,
        elsewhere=lambda name: _kwargs_left_over(creator, env.kwargs) if name in env.kwargs else "",
    )
    return EnvCheck(spec.id, creator, _made_class(creator), kwargs)


def _kwargs_left_over(creator: Callable[..., Any], given: Mapping[str, Any]) -> str:
    """How to drop kwargs another env's config left in ``env.kwargs`` (e.g. Sokoban's defaults
    under a custom ``env.id``): Hydra merges ``env.kwargs={}`` into them, only ``~key`` deletes."""
    try:
        params: Mapping[str, Any] = inspect.signature(creator).parameters
    except (TypeError, ValueError):
        params = {}
    extra = [k for k in given if k not in params] or list(given)
    delete = " ".join(f"~env.kwargs.{k}" for k in extra)
    return (
        f"on the command line: {delete}; env.kwargs={{}} does not clear them, Hydra merges it "
        "into the env config's kwargs. Or start from env=gym, which sets no kwargs: "
        "env=gym env.id=<your id>"
    )


def _made_class(creator: Callable[..., Any]) -> type | None:
    if isinstance(creator, type):
        return creator
    try:
        made = typing.get_type_hints(creator).get("return")
    except Exception:  # an annotation that does not resolve: the class stays unknown
        return None
    # `-> Any` (a class since Python 3.11) or `-> gym.Env` names no concrete env: unknown.
    import gymnasium

    vague = made is typing.Any or made in (object, gymnasium.Env)
    return made if isinstance(made, type) and not vague else None


def qualname(obj: Any) -> str:
    """``module.QualName`` of a class or function, for messages that name it."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def build_env(env: EnvCheck, check: str) -> Any:
    """One env made by ``env``'s entry point, as ``gym.make`` would (without its wrappers), or
    None when it cannot be built here (the workers then report that themselves); ``check`` names
    the driver check that asks, for the debug log."""
    kwargs = {k: v for k, v in env.kwargs.items() if k not in MAKE_KWARGS}
    try:
        return env.entry_point(**kwargs)
    except Exception as e:  # not this check's error: the workers build it and say why
        log.debug("%s: env %r not built here (%s: %s)", check, env.id, type(e).__name__, e)
        return None
