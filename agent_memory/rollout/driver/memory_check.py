"""The preflight's memory checks: the token counter, formatter and memory a worker builds
(:func:`~agent_memory.rollout.history.job_memory`), built the cheap way (one env, database files in
a temporary directory), each error naming the override that fixes it.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, MemoryConfig, PolicyConfig
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"), policy=PolicyConfig("random"),
    ...                 memory=MemoryConfig("retrieval", params={"top_kk": 2}))
    >>> with checked_memory(job, check_token_counter("estimate")) as memory:
    ...     pass
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: memory.params has no parameter 'top_kk' for strategy \
'retrieval'...
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError, JobConfig
from agent_memory.config_fields import config_fields, settings_class
from agent_memory.memory import BaseMemory
from agent_memory.rollout.history import MEMORY_SHARED, job_memory
from agent_memory.signatures import BUILD_ERRORS, bind_params, build_or_blame
from agent_memory.suggest import did_you_mean, override_value

__all__ = [
    "COUNTERS",
    "check_formatter",
    "check_registered",
    "check_token_counter",
    "checked_memory",
    "other_strategies",
    "settings_names",
]

#: Token counter names ``make_token_counter`` knows (besides ``hf:<path>`` and ``estimate:<n>``).
COUNTERS = ("estimate", "chars", "qwen", "qwen3.5")


def check_registered(name: str, registered: list[str], key: str, what: str, fix: str) -> None:
    """Refuse a ``name`` that is not ``registered``, with the nearest registered one."""
    if name not in registered:
        hint = did_you_mean(name, registered, prefix=f"{key}=")
        raise ConfigError(
            f"{key}={name!r} is not a registered {what}: "
            + (f"{hint} " if hint else "")
            + f"Registered: {registered}{fix}",
            key=key,
        )


def check_token_counter(spec: Any) -> Any:
    """The token counter ``memory.token_counter`` names; refused with the nearest name."""
    from agent_memory.tokens import make_token_counter

    try:
        return make_token_counter(spec)
    except BUILD_ERRORS as e:
        # A name that is not one: the nearest that is (a known name failed for another reason).
        near = [] if str(spec) in COUNTERS else COUNTERS
        hint = did_you_mean(str(spec), near, prefix="memory.token_counter=")
        raise ConfigError(
            f"memory.token_counter={spec!r} cannot be built ({type(e).__name__}: {e}): "
            + (hint or "pass e.g. memory.token_counter=estimate"),
            key="memory.token_counter",
        ) from None


def check_formatter(spec: Any) -> Any:
    """The formatter ``env.formatter`` describes; refused naming the key at fault."""
    from agent_memory.formatting import available_formatters, formatter_factory, make_formatter

    name = spec.get("name") if isinstance(spec, Mapping) else spec
    key = "env.formatter.name" if isinstance(spec, Mapping) else "env.formatter"
    if isinstance(name, str):
        check_registered(
            name, available_formatters(), key, "formatter", f": pass e.g. {key}=simple"
        )
    names = {"formatter": "env.formatter"}
    if isinstance(spec, Mapping) and isinstance(name, str):
        settings = {k: v for k, v in spec.items() if k != "name"}
        factory = formatter_factory(name)
        bind_params(factory, settings, key="env.formatter", what=f"formatter {name!r}")
        names = {k: f"env.formatter.{k}" for k in settings} | names
    return build_or_blame(lambda: make_formatter(spec), f"env.formatter={name!r}", names)


@contextmanager
def checked_memory(job: JobConfig, counter: Any) -> Iterator[BaseMemory]:
    """The job's memory for one env (:func:`~agent_memory.rollout.history.job_memory`, as the
    workers build theirs), database files in a temporary directory; closed on exit.

    Raises:
        ConfigError: an unknown strategy, a parameter it does not take, a database path that
            cannot be written, or a value its constructor refuses, with the override to fix.
    """
    from agent_memory.memory import available_memories, memory_factory

    mem = job.memory
    strategy = mem.strategy
    fix = "; or choose a memory config, e.g. memory=window"
    check_registered(strategy, available_memories(), "memory.strategy", "memory strategy", fix)
    params = dict(mem.params)
    factory = memory_factory(strategy)
    bind_params(
        factory,
        params,
        key="memory.params",
        what=f"strategy {strategy!r}",
        reserved=MEMORY_SHARED,
        elsewhere=lambda name: other_strategies(name, strategy, params[name]),
    )
    names = {k: f"memory.params.{k}" for k in params} | MEMORY_SHARED
    with tempfile.TemporaryDirectory(prefix="agent_memory-preflight-") as tmp:
        for k, v in params.items():
            if k == "path" and isinstance(v, str):  # the strategy's database file
                _check_writable(v, "memory.params.path")
                params[k] = str(Path(tmp) / (Path(v).name or "memory.sqlite"))
        memory = build_or_blame(
            lambda: job_memory(job, 1, counter, params), f"memory.strategy={strategy!r}", names
        )
        try:
            yield memory
        finally:
            memory.close()


def other_strategies(name: str, strategy: str, value: Any) -> str:
    """Which other strategies take ``name`` (or the closest name), with the overrides that
    choose one and set it to ``value`` (``++``: whether or not its config has the key): an
    unknown parameter's hint."""
    from agent_memory.memory import available_memories, memory_factory
    from agent_memory.suggest import close_matches

    owners: dict[str, list[str]] = {}
    for other in available_memories():
        if other != strategy:
            for param in settings_names(memory_factory(other)):
                owners.setdefault(param, []).append(other)
    best = [name] if name in owners else close_matches(name, owners, n=1)
    if not best:
        return f"strategy {strategy!r} takes no such parameter"
    having = owners[best[0]]
    fix = f"memory={having[-1]} ++memory.params.{best[0]}={override_value(value)}"
    return f"{best[0]} is a parameter of strategy {', '.join(having)}: e.g. {fix}"


def settings_names(factory: Any) -> list[str]:
    """The keys ``memory.params`` (or ``policy.params``) takes for ``factory``: its settings
    dataclass's fields, else (a user's class without one) its signature's parameters."""
    settings = settings_class(factory)
    if settings is not None:
        return [f.name for f in config_fields(settings)]
    try:
        return list(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return []


def _check_writable(path: str, key: str) -> None:
    """Refuse a database file the workers could not create or write: a directory, a path
    through a file, a name longer than the file system takes, or a directory where no file can
    be made (tried, not read from the mode bits: a read-only file system refuses even root)."""
    p = Path(path).expanduser()
    fix = f"pass a path in a writable directory, e.g. {key}={{output_dir}}/{p.name[:40]}"
    parent = p.parent
    while not _exists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(
            f"{key}={path!r} cannot be created: {str(parent)!r} is a file, not a directory: {fix}",
            key=key,
        )
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in p.parts[len(parent.parts) :]:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(
                f"{key}={path!r} cannot be created: the name {part[:24]!r}... is "
                f"{len(os.fsencode(part))} bytes, longer than the {name_max} its file system "
                f"takes: pass a shorter name, e.g. {key}={{output_dir}}/memory.sqlite",
                key=key,
            )
    if p.is_dir():
        raise ConfigError(f"{key}={path!r} is a directory: pass a file path", key=key)
    try:
        if p.exists():  # opened for appending, closed at once: its content is left as it is
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        else:
            tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        where = str(p) if p.exists() else str(parent)
        raise ConfigError(
            f"{key}={path!r} cannot be written: {where!r} is not writable "
            f"({type(e).__name__}: {e.strerror or e}): {fix}",
            key=key,
        ) from None


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # e.g. a name too long to look up
        return False
