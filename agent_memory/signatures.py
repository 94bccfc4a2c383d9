"""Config params checked against the constructor they are passed to: :func:`bind_params` checks
names before anything is built (a typo gets the nearest valid name); :func:`build_or_blame`
turns a constructor's error about a bad value into a :class:`~agent_memory.config.ConfigError`
naming the config key to change.

Example:
    >>> def make_index(top_k=3, threshold=0.1):
    ...     if top_k < 0:
    ...         raise ValueError(f"top_k must be >= 0, got {top_k}")
    >>> names = {"top_k": "memory.params.top_k", "threshold": "memory.params.threshold"}
    >>> build_or_blame(lambda: make_index(top_k=-1), "the index", names)
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: the index cannot be built: top_k must be >= 0, got -1: \
change memory.params.top_k
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING
from typing import Any

from agent_memory.config import ConfigError
from agent_memory.config_fields import config_fields, settings_class
from agent_memory.suggest import close_matches, override_value

__all__ = ["BUILD_ERRORS", "bind_params", "blame", "build_or_blame"]

#: Errors a constructor raises for a bad setting (anything else is a bug: it keeps its traceback).
BUILD_ERRORS = (ValueError, TypeError, ImportError, OSError, LookupError)


def bind_params(
    factory: Callable[..., Any],
    given: Mapping[str, Any],
    *,
    key: str,
    what: str,
    reserved: Mapping[str, str] | None = None,
    elsewhere: Callable[[str], str] | None = None,
    configured: Collection[str] | None = None,
) -> None:
    """Refuse keys of ``given`` that ``factory`` does not take (naming the nearest valid ones)
    or that another config key sets (``reserved``), and required parameters ``given`` lacks.
    A class that declares a settings dataclass (``settings_class``) takes its config fields.

    Args:
        factory: the class or function the params are passed to as keyword arguments.
        given: the params (e.g. ``memory.params``).
        key: the config key they come from, for messages (``"memory.params"``).
        what: what is built, for messages (``"strategy 'retrieval'"``).
        reserved: parameters the caller passes itself.
        elsewhere: ``name -> hint`` for an unknown name with nothing close to it.
        configured: the names the composed config holds under ``key`` (default: ``given``'s):
            the suggested override sets one of them as it is, another with ``+``.

    Example:
        >>> def make(top_k=3, header="x"):
        ...     pass
        >>> bind_params(make, {"top_kk": 3}, key="memory.params", what="strategy 'demo'")
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: memory.params has no parameter 'top_kk' for strategy \
'demo': did you mean +memory.params.top_k=3? Valid: ['top_k', 'header']
    """
    reserved = reserved or {}
    keywords = _keywords(factory)
    if keywords is None:  # no signature to read (a builtin): nothing to check
        return
    params, open_ended = keywords
    valid = [n for n in params if n not in reserved]
    for name in given:
        if name in reserved:
            raise ConfigError(
                f"{key}.{name} is set by {reserved[name]}, not by {key}: remove {key}.{name}",
                key=f"{key}.{name}",
            )
        if name not in valid and not open_ended:
            hint = _renamed(name, given, valid, key, configured)
            if not hint:
                other = elsewhere(name) if elsewhere is not None else ""
                hint = f"remove {key}.{name}" + (f" ({other})." if other else ".")
            raise ConfigError(
                f"{key} has no parameter {name!r} for {what}: {hint} Valid: {valid}",
                key=f"{key}.{name}",
            )
    for name, required in params.items():
        if required and name not in given and name not in reserved:
            raise ConfigError(
                f"{what} needs the parameter {name!r}, which {key} does not set: "
                f"pass +{key}.{name}=<value>",
                key=f"{key}.{name}",
            )


def _keywords(factory: Callable[..., Any]) -> tuple[dict[str, bool], bool] | None:
    """``({keyword: required}, takes **kwargs)`` of ``factory``: the config fields of the
    settings dataclass it declares (:func:`~agent_memory.config_fields.settings_class`), else
    its signature's keyword parameters; None when it has no signature to read."""
    settings = settings_class(factory)
    if settings is not None:
        fields = config_fields(settings)
        return {f.name: f.default is MISSING is f.default_factory for f in fields}, False
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = {
        n: p.default is inspect.Parameter.empty
        for n, p in sig.parameters.items()
        if p.kind in keyword
    }
    open_ended = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    return params, open_ended


def _renamed(
    name: str,
    given: Mapping[str, Any],
    valid: list[str],
    key: str,
    configured: Collection[str] | None,
) -> str:
    """``"did you mean <override>?"``: the nearest valid names set to ``given[name]``, as
    overrides (``+`` for a name the config does not hold yet: not in ``configured``, by default
    ``given``), or ``""``."""
    held = given if configured is None else configured
    value = override_value(given[name])
    fixes = [f"{'' if m in held else '+'}{key}.{m}={value}" for m in close_matches(name, valid)]
    return f"did you mean {' or '.join(fixes)}?" if fixes else ""


def build_or_blame(make: Callable[[], Any], what: str, names: Mapping[str, str]) -> Any:
    """``make()``, with a settings error (:data:`BUILD_ERRORS`) turned into a
    :class:`ConfigError` naming the keys to change (see :func:`blame`)."""
    try:
        return make()
    except ConfigError:
        raise
    except BUILD_ERRORS as e:
        raise blame(e, what, names) from e


def blame(error: BaseException, what: str, names: Mapping[str, str]) -> ConfigError:
    """A :class:`ConfigError` for a constructor's ``error``: its message, then the config keys
    to change — those of ``names`` (constructor argument -> config key) the message mentions, in
    the order it mentions them.

    Example:
        >>> e = ValueError("retention must be one of ['single_run'], got 'forever'")
        >>> print(blame(e, "memory.strategy='episodic'", {"retention": "memory.params.retention"}))
        memory.strategy='episodic' cannot be built: retention must be one of ['single_run'], got \
'forever': change memory.params.retention
        >>> e = FileNotFoundError("path must be a model directory, got '/no/such/model'")
        >>> blame(e, "policy=hf", {"path": "policy.params.path", "model": "x.model"}).key
        'policy.params.path'
    """
    message = str(error).rstrip(".") or type(error).__name__
    if not isinstance(error, ValueError):
        message = f"{type(error).__name__}: {message}"
    # "got '<value>'" quotes what the user gave (e.g. a path ending in "/model"), never a key.
    unquoted = re.sub(r"got ('[^']*'|\"[^\"]*\")", lambda m: " " * len(m.group()), message)
    hits = []
    for name, key in names.items():
        m = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", unquoted)
        if m is not None and key:
            hits.append((m.start(), key))
    keys = list(dict.fromkeys(k for _, k in sorted(hits)))  # in the order the message names them
    fix = (
        f"change {' or '.join(keys)}" if keys else f"check {', '.join(sorted(set(names.values())))}"
    )
    return ConfigError(f"{what} cannot be built: {message}: {fix}", key=keys[0] if keys else None)
