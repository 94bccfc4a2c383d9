"""Hydra entry points whose config errors are one clear message, not a stack trace.

:func:`hydra_main` is ``hydra.main`` that prints a config error (a misspelled key gets "did you
mean ...?") as its message alone and exits with :data:`CONFIG_ERROR_EXIT`. Other errors keep their
traceback; ``HYDRA_FULL_ERROR=1`` leaves every error to Hydra.

Example:
    >>> from omegaconf.errors import ConfigAttributeError
    >>> from hydra.errors import ConfigCompositionException
    >>> from omegaconf import OmegaConf
    >>> parent = OmegaConf.create({"group_size": 4, "num_groups": 4})
    >>> cause = ConfigAttributeError("Key 'group_sise' not in 'RolloutConfig'")
    >>> cause.full_key, cause.parent_node = "rollout.group_sise", parent
    >>> err = ConfigCompositionException(
    ...     "Could not override 'rollout.group_sise'.\\nTo append to your config use "
    ...     "+rollout.group_sise=8")
    >>> err.__cause__ = cause
    >>> print(config_error_message(err))
    rollout.group_sise is not a config key: did you mean rollout.group_size=8? (keys of rollout: \
group_size, num_groups)
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from agent_memory.config import ConfigError, unknown_key
from agent_memory.failures import RunFailed, describe_exception, first_line, is_sigterm
from agent_memory.suggest import did_you_mean

__all__ = [
    "CONFIG_ERROR_EXIT", "config_error_message", "hydra_main", "import_from_launch_dir",
    "report_config_errors", "script_failures",
]  # fmt: skip

#: Exit status of a script stopped by a config error (2: a usage error, as argparse uses).
CONFIG_ERROR_EXIT = 2


def import_from_launch_dir() -> str:
    """Put the launch directory (the working directory, read before Hydra could change it) on
    ``sys.path`` after the script's own directory, so ``env.id=my_envs:Corridor-v0`` imports a
    ``my_envs.py`` there (Ray's workers get it from ``ray.init``); returns it."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(1 if sys.path else 0, here)
    return here


def hydra_main(
    config_name: str, config_path: str = "../configs"
) -> Callable[[Callable[[DictConfig], Any]], Callable[..., Any]]:
    """``@hydra.main(version_base="1.3", config_path=..., config_name=...)`` whose config errors
    print their message and exit with :data:`CONFIG_ERROR_EXIT`; the launch directory is
    importable (:func:`import_from_launch_dir`). ``config_path`` is relative to the decorated
    function's file, as with ``hydra.main``.
    """
    import hydra

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[..., Any]:
        main_of = hydra.main(version_base="1.3", config_path=config_path, config_name=config_name)
        entry = main_of(task)

        @functools.wraps(task)
        def main(cfg_passthrough: DictConfig | None = None) -> Any:
            import_from_launch_dir()  # before Hydra, which may change the working directory
            return report_config_errors(lambda: entry(cfg_passthrough))

        return main

    return decorate


@contextlib.contextmanager
def script_failures(what: str, kept: str, interrupted: str) -> Iterator[None]:
    """A script's run after its config is checked: a failure prints ``"{what} failed: <the
    error>"`` and ``kept`` (where the outputs so far are) and exits with status 1; Ctrl-C prints
    ``"Interrupted (Ctrl-C); {interrupted}"`` and exits with 130 (SIGTERM: 143). A
    :class:`ConfigError` passes through (:func:`hydra_main` prints it; status 2).

    Example:
        >>> with script_failures("Rollout", "What finished is in out/", "see out/"):
        ...     raise ValueError("bad")
        Traceback (most recent call last):
        ...
        SystemExit: 1
    """
    try:
        yield
    except ConfigError:
        raise
    except KeyboardInterrupt as e:
        term = is_sigterm(e)
        sys.stderr.write(f"\nInterrupted ({'SIGTERM' if term else 'Ctrl-C'}); {interrupted}\n")
        raise SystemExit(143 if term else 130) from None
    except RunFailed as e:
        sys.stderr.write(f"{what} failed: {e}\n{kept}\n")
        raise SystemExit(1) from None
    except Exception as e:
        sys.stderr.write(f"{what} failed: {describe_exception(e)}\n{kept}\n")
        raise SystemExit(1) from None


def report_config_errors(run: Callable[[], Any]) -> Any:
    """``run()``; a config error is written to stderr as :func:`config_error_message` and ends
    the process with :data:`CONFIG_ERROR_EXIT`; other exceptions propagate untouched."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return run()  # the user asked for Hydra's own full errors
    # Hydra prints errors it catches itself (stack and all) unless HYDRA_FULL_ERROR=1, in which
    # case it re-raises them: set it for this call, so that they reach us as exceptions.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return run()
    except Exception as e:
        message = config_error_message(e)
        if message is None:
            raise
        sys.stderr.write(f"Config error: {message}\n")
        sys.stderr.flush()
        raise SystemExit(CONFIG_ERROR_EXIT) from None
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def config_error_message(error: BaseException) -> str | None:
    """The one-paragraph message of a config error, or None when ``error`` is not one."""
    from hydra.errors import (
        CompactHydraException,
        ConfigCompositionException,
        MissingConfigException,
    )

    if isinstance(error, ConfigError):
        return str(error)
    if isinstance(error, MissingConfigException):
        return _missing_config(error)
    cause = error.__cause__
    unknown = isinstance(cause, (ConfigAttributeError, ConfigKeyError))
    if isinstance(error, ConfigCompositionException) and unknown:
        return _unknown_override(error, cause)
    if isinstance(error, CompactHydraException):
        text = str(error).strip()
        if isinstance(cause, OmegaConfBaseException):
            text += f": {first_line(str(cause)) or type(cause).__name__}"
        return text
    if isinstance(error, OmegaConfBaseException):
        return str(error).strip()
    return None


def _missing_config(error: Any) -> str:
    missing = error.missing_cfg_file or ""
    group, _, name = missing.rpartition("/")
    options = list(error.options or [])
    if not group or not options:
        return first_line(str(error)) or type(error).__name__
    hint = did_you_mean(name, options, prefix=f"{group}=")
    more = f"{hint} " if hint else ""
    listed = ", ".join(options)
    return f"{group}={name}: configs/{group}/ has no {name}.yaml: {more}Options: {listed}"


def _unknown_override(error: BaseException, cause: Any) -> str:
    full_key = str(getattr(cause, "full_key", None) or getattr(cause, "key", "?"))
    parent = getattr(cause, "parent_node", None)
    keys = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
    m = re.search(r"use \+(\S+)", str(error))
    line = m.group(1) if m else full_key
    value = line.partition("=")[2] if "=" in line else None
    if getattr(cause, "object_type", None) is not dict:
        return str(unknown_key(full_key, keys, value))
    # A free-form dict (env.kwargs, memory.params, policy.params): new keys are allowed with +,
    # and preflight checks them against the constructor they are passed to.
    where, _, name = full_key.rpartition(".")
    suffix = "" if value is None else f"={value}"
    hint = did_you_mean(name, keys, prefix=f"{where}.", suffix=suffix)
    return (
        f"{full_key}: {where} has no {name!r} in this config ({', '.join(keys) or 'it is empty'}): "
        + (hint or f"to add it, write +{line} (checked against its constructor before Ray starts)")
    )
