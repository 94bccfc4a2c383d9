"""Hydra entry points whose config errors are one clear message, not a stack trace.

:func:`hydra_main` is ``hydra.main`` that prints a config error as one line ("did you mean
...?"; for a config file of the user's own, the file, the key and the nearest valid key) and exits
with :data:`CONFIG_ERROR_EXIT`, removing what Hydra wrote for the refused job
(:func:`discard_run_dir`). Other errors keep their traceback; ``HYDRA_FULL_ERROR=1`` leaves every
error to Hydra.

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
import dataclasses
import functools
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from agent_memory.config import CONFIG_ERROR_EXIT, ConfigError, unknown_key
from agent_memory.failures import RunFailed, describe_exception, first_line, is_sigterm
from agent_memory.rundir import LOCK_FILE, RUN_TOKEN
from agent_memory.suggest import did_you_mean

__all__ = [
    "CONFIG_ERROR_EXIT",
    "config_error_message",
    "discard_run_dir",
    "hydra_main",
    "import_from_launch_dir",
    "report_config_errors",
    "script_failures",
]

#: Exit status of a script stopped by a config error (2: a usage error, as argparse uses).


def import_from_launch_dir() -> str:
    """Put the launch directory (the working directory, read before Hydra could change it) on
    ``sys.path`` after the script's own directory, so ``env.id=my_envs:Corridor-v0`` imports a
    ``my_envs.py`` there (Ray's workers get it from ``ray.init``); returns it."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(1 if sys.path else 0, here)
    return here


def hydra_main(
    config_name: str, config_path: str = "../configs", hidden_groups: Sequence[str] = ()
) -> Callable[[Callable[[DictConfig], Any]], Callable[..., Any]]:
    """``@hydra.main(version_base="1.3", config_path=..., config_name=...)`` whose config errors
    print their message and exit with :data:`CONFIG_ERROR_EXIT`; the launch directory is
    importable (:func:`import_from_launch_dir`). ``config_path`` is relative to the decorated
    function's file, as with ``hydra.main``. ``hidden_groups``: config groups of the directory
    that ``--help`` leaves out (another script's, e.g. train.py's ``trainer``).
    """
    import hydra

    register_resolvers()

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[..., Any]:
        main_of = hydra.main(version_base="1.3", config_path=config_path, config_name=config_name)
        primary = str((Path(inspect.getfile(task)).parent / config_path).resolve())
        hydra_reports = False  # the user set HYDRA_FULL_ERROR=1: Hydra reports every error
        existing: dict[Path, set[str]] = {}  # given run directories that exist -> their entries

        @functools.wraps(task)  # Hydra finds the configs next to the unwrapped task's file
        def job(cfg: DictConfig) -> Any:
            if hydra_reports:
                return task(cfg)
            try:
                return task(cfg)
            except Exception as e:  # a config error once Hydra made the run directory
                message = config_error_message(e)
                if message is None:
                    raise
            discard_run_dir(keep=existing)  # Hydra never sees the error: no "Error executing job"
            _print_config_error(message)
            raise SystemExit(CONFIG_ERROR_EXIT)

        entry = main_of(job)

        @functools.wraps(task)
        def main(cfg_passthrough: DictConfig | None = None) -> Any:
            nonlocal hydra_reports
            hydra_reports = os.environ.get("HYDRA_FULL_ERROR") == "1"
            if hidden_groups:
                hide_config_groups(hidden_groups)
            existing.clear()
            existing.update(_given_run_dirs(sys.argv[1:]))  # before Hydra writes there
            import_from_launch_dir()  # before Hydra, which may change the working directory
            dirs = [*_config_dirs(sys.argv[1:]), primary]
            return report_config_errors(lambda: entry(cfg_passthrough), config_dirs=dirs)

        return main

    return decorate


def dirname(overrides: str) -> str:
    r"""``hydra.job.override_dirname`` as one directory's name (the configs' sweep subdirs:
    ``${am_dirname:${hydra.job.override_dirname}}``): Hydra escapes ``:``, ``=``, brackets and
    spaces in a value with a backslash, and a ``/`` would nest directories; each such character
    becomes ``_``, the escapes go.

    Example:
        >>> dirname(r"env.id=my_envs\:Corridor-v0,env.kwargs={n\:1},memory=window")
        'env.id=my_envs_Corridor-v0,env.kwargs=_n_1_,memory=window'
    """
    unescaped = re.sub(r"\\(.)", r"\1", overrides)
    return re.sub(r'[\\/:*?"<>|{}\[\]()\s]', "_", unescaped)


def register_resolvers() -> None:
    """Register the configs' own resolvers with OmegaConf (``am_dirname``: :func:`dirname`;
    ``am_run_token``: :data:`agent_memory.rundir.RUN_TOKEN`, this process's token in the
    default run directories)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("am_dirname", dirname, replace=True)
    OmegaConf.register_new_resolver("am_run_token", lambda: RUN_TOKEN, replace=True)


def hide_config_groups(groups: Sequence[str]) -> None:
    """Leave ``groups`` (and their subgroups) out of the config groups Hydra's ``--help`` lists
    (``$APP_CONFIG_GROUPS``): Hydra lists every group of the config directory, also those only
    another script's config selects. Composition is unchanged (``group=option`` still works)."""
    from hydra._internal.hydra import Hydra

    original = getattr(Hydra.format_config_groups, "_unhidden", Hydra.format_config_groups)
    hidden = tuple(groups)

    def format_config_groups(
        self: Any, predicate: Callable[[str], bool], compact: bool = True
    ) -> str:
        def shown(group: str) -> bool:
            return predicate(group) and group.split("/")[0] not in hidden

        return str(original(self, shown, compact))

    format_config_groups._unhidden = original  # type: ignore[attr-defined]
    Hydra.format_config_groups = format_config_groups  # type: ignore[method-assign]


def _config_dirs(argv: Sequence[str]) -> list[str]:
    """The ``--config-dir`` / ``-cd`` directories of a command line (Hydra searches them)."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(argv[i + 1])
        elif arg.startswith(("--config-dir=", "-cd=")):
            dirs.append(arg.partition("=")[2])
    return dirs


def _given_run_dirs(argv: Sequence[str]) -> dict[Path, set[str]]:
    """The directories ``hydra.run.dir=`` / ``hydra.sweep.dir=`` name that exist already, with
    the names of their entries."""
    found = {}
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        if eq and key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value:
            path = Path(value.strip("'\"")).expanduser().absolute()
            if path.is_dir():
                found[path] = {p.name for p in path.iterdir()}
    return found


def _print_config_error(message: str) -> None:
    """``Config error: <message>`` on stderr, as one line."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    sys.stderr.write(f"Config error: {line}\n")
    sys.stderr.flush()


#: The files Hydra writes into ``<run dir>/<hydra.output_subdir>`` before the job runs.
HYDRA_FILES = frozenset({"config.yaml", "hydra.yaml", "overrides.yaml"})


def discard_run_dir(keep: Mapping[Path, set[str]] | None = None) -> list[Path]:
    """Remove what Hydra wrote for the current, refused job: ``.hydra/`` and the (empty) log,
    then the run directory and its parents while empty (a sweep's holding only
    ``multirun.yaml`` and this process's lock too), up to the launch directory. Anything else
    (another run's) is left, as are ``keep``'s directories and their entries from before the run.
    Returns the directories removed.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).absolute()
    launch = Path(hc.runtime.cwd).absolute()
    sweep = Path(hc.sweep.dir).absolute() if hc.mode == RunMode.MULTIRUN else None
    keep = keep or {}
    ours = {hc.output_subdir or "", f"{hc.job.name}.log", LOCK_FILE} - keep.get(run_dir, set())
    if not _remove_hydra_files(run_dir, ours, kept=keep.get(run_dir, set())):
        return []
    removed = []
    here = run_dir
    # Never the launch directory nor one above it; above the run directory, only those inside
    # the launch directory (made by Hydra for this run: outputs/rollout/<date>/) or the sweep's.
    while here.is_dir() and not launch.is_relative_to(here) and here not in keep:
        if here != run_dir and here != sweep and not here.is_relative_to(launch):
            break
        if here == sweep and {p.name for p in here.iterdir()} <= {"multirun.yaml", LOCK_FILE}:
            for name in ("multirun.yaml", LOCK_FILE):  # Hydra's, and this process's lock
                (here / name).unlink(missing_ok=True)
        if any(here.iterdir()):
            break
        here.rmdir()
        removed.append(here)
        here = here.parent
    return removed


def _remove_hydra_files(run_dir: Path, ours: set[str], kept: set[str]) -> bool:
    """Remove the entries ``ours`` of ``run_dir`` (Hydra's: its subdirectory of config files,
    the job's log; the lock this process took on the directory as Hydra started) when
    ``run_dir`` holds nothing else but the ``kept`` ones and they are as Hydra leaves them
    before the job (three files; an empty log). Whether they were removed."""
    _close_logs_in(run_dir)
    entries = {p.name: p for p in run_dir.iterdir()} if run_dir.is_dir() else {}
    mine = [p for name, p in entries.items() if name not in kept]
    if any(p.name not in ours for p in mine):
        return False  # written by the run, or by another one
    for p in mine:
        is_meta = p.is_dir() and {f.name for f in p.iterdir()} <= HYDRA_FILES
        if not (is_meta or (p.is_file() and (p.name == LOCK_FILE or p.stat().st_size == 0))):
            return False
    for p in mine:
        if p.is_dir():
            for f in p.iterdir():
                f.unlink()
            p.rmdir()
        else:
            p.unlink()
    return True


def _close_logs_in(folder: Path) -> None:
    """Close and drop the root logger's file handlers writing into ``folder`` (Hydra's job log)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        name = getattr(handler, "baseFilename", None)
        if isinstance(name, str) and Path(name).is_relative_to(folder):
            root.removeHandler(handler)
            handler.close()


@contextlib.contextmanager
def script_failures(what: str, kept: str, interrupted: str) -> Iterator[None]:
    """A script's run after its config is checked: a failure prints ``"{what} failed: <the
    error>"`` and ``kept``, status 1; Ctrl-C prints ``"Interrupted (Ctrl-C); {interrupted}"``,
    status 130 (SIGTERM: 143). A :class:`ConfigError` passes through (status 2).

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


def report_config_errors(run: Callable[[], Any], config_dirs: Sequence[str] = ()) -> Any:
    """``run()``; a config error is written to stderr as :func:`config_error_message` (one line)
    and ends the process with :data:`CONFIG_ERROR_EXIT`; other exceptions propagate untouched.
    ``config_dirs``: where Hydra looks for config files (to name the file at fault)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return run()  # the user asked for Hydra's own full errors
    # Hydra prints errors it catches itself (stack and all) unless HYDRA_FULL_ERROR=1, in which
    # case it re-raises them: set it for this call, so that they reach us as exceptions.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return run()
    except Exception as e:
        message = config_error_message(e, config_dirs)
        if message is None:
            raise
        _print_config_error(message)
        raise SystemExit(CONFIG_ERROR_EXIT) from None
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def config_error_message(error: BaseException, config_dirs: Sequence[str] = ()) -> str | None:
    """The one-paragraph message of a config error, or None when ``error`` is not one.

    ``config_dirs``: where Hydra looks for config files, to name the file an error is in.
    """
    import yaml
    from hydra.errors import (
        CompactHydraException,
        ConfigCompositionException,
        MissingConfigException,
    )

    if isinstance(error, ConfigError):
        return str(error)
    if isinstance(error, MissingConfigException):
        return _missing_config(error)
    if isinstance(error, yaml.MarkedYAMLError):
        return _yaml_syntax(error)
    in_file = _IN_FILE.match(str(error))
    if isinstance(error, ConfigCompositionException) and in_file:
        return _config_file_error(in_file[1], error.__cause__ or error.__context__, config_dirs)
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
    # "+key" only where the preflight would take it; else the nearest key, or what it would say.
    refusal = None
    if isinstance(parent, DictConfig):
        from agent_memory.rollout.driver.added_keys import refuse_added_key

        refusal = refuse_added_key(full_key, _override_value(line), parent._get_root())
    if refusal and not hint:
        return refusal
    add = f"to add it, write +{line} (checked against its constructor before Ray starts)"
    return (
        f"{full_key}: {where} has no {name!r} in this config ({', '.join(keys) or 'it is empty'}): "
        + (add if refusal == "" or not hint else hint)
    )


def _override_value(line: str) -> Any:
    """The value of override ``key=value`` as Hydra reads it (the text itself if it cannot)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(line).value()
    except Exception:  # not an override Hydra reads: the text is what the user wrote
        return line.partition("=")[2]


#: How Hydra names the config file an error was raised in: "In 'env/corridor': ...".
_IN_FILE = re.compile(r"In '([^']+)': \w+ raised while composing config")


def _config_file_error(name: str, cause: BaseException | None, dirs: Sequence[str]) -> str:
    """An error in config file ``name`` (``group/option``, as Hydra names it) as one line: the
    file, the key, and for a key the schema lacks the nearest valid one (the key as the file
    writes it: without the group's package)."""
    where = _find_config(name, dirs)
    full_key = str(getattr(cause, "full_key", None) or "")
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not full_key:
        text = first_line(str(cause)) if cause is not None else ""
        return f"{where}: " + (f"{full_key}: " if full_key else "") + (text or "invalid config")
    package = name.rpartition("/")[0].replace("/", ".")
    in_file = full_key.removeprefix(f"{package}.") if package else full_key
    parent, _, key = in_file.rpartition(".")
    keys = _keys_of(cause)
    hint = did_you_mean(key, keys, prefix=f"{parent}." if parent else "")
    owner = full_key.rpartition(".")[0] or "the job config"
    return (
        f"{where}: {in_file} is not a config key ({full_key}): {hint or 'remove it'} "
        f"(keys of {owner}: {', '.join(keys)})"
    )


def _keys_of(cause: BaseException) -> list[str]:
    """The keys the node an unknown key was set on has: its schema's fields, else its keys."""
    schema = getattr(cause, "object_type", None)
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    parent = getattr(cause, "parent_node", None)
    return [str(k) for k in parent] if isinstance(parent, DictConfig) else []


def _find_config(name: str, dirs: Sequence[str]) -> str:
    """The file of config ``name`` in the first of ``dirs`` that has it (relative to the working
    directory when inside it), or ``config 'name'`` when none has."""
    for folder in dirs:
        path = Path(folder).expanduser() / f"{name}.yaml"
        if path.is_file():
            return _shown(path)
    return f"config {name!r}"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when inside it, else absolute."""
    path = path.absolute()
    here = Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def _yaml_syntax(error: Any) -> str:
    """A YAML syntax error as one line: file, line, column, what is wrong."""
    mark = error.problem_mark
    named = mark is not None and mark.name and not mark.name.startswith("<")
    where = _shown(Path(mark.name)) if named else "a config file"
    if mark is not None:
        where += f", line {mark.line + 1}, column {mark.column + 1}"
    problem = error.problem or type(error).__name__
    context = ""
    if error.context:
        start = error.context_mark
        at = f" that starts at line {start.line + 1}, column {start.column + 1}" if start else ""
        context = f" ({error.context}{at})"
    return f"{where}: {problem}{context}: fix the YAML there"
