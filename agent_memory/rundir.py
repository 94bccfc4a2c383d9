"""One live run per output directory, and default directories that never collide.

A run holds its output directory with an OS lock (``fcntl.flock`` on ``<dir>/.run.lock``; the
kernel releases it however the process ends, so no lock goes stale). Another run naming it is
refused before writing there (:class:`RunDirInUse`, naming the holder and the overrides to choose
another). Scripts take it as Hydra starts (:class:`HoldRunDir`). Default directories end in
``${am_run_token:}``, drawn per process: runs started in the same second never collide.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with hold_run_dir(d, "rollout.output_dir"):
    ...     try:
    ...         with hold_run_dir(d, "rollout.output_dir"):
    ...             pass
    ...     except RunDirInUse as e:
    ...         print(str(e).startswith(f"{d} is held by another live run (another run in this"))
    True
    >>> with hold_run_dir(d, "rollout.output_dir"):  # free again
    ...     pass
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_memory.config import CONFIG_ERROR_EXIT, ConfigError

__all__ = [
    "LOCK_FILE",
    "RUN_TOKEN",
    "HoldRunDir",
    "RunDirInUse",
    "hold_run_dir",
]

#: The lock file a run holds in its output directory (left in place: it is locked, not present).
LOCK_FILE = ".run.lock"
#: This process's token in default directory names (``${am_run_token:}``, registered by
#: :func:`agent_memory.cli.register_resolvers`): 6 hex digits.
RUN_TOKEN = secrets.token_hex(3)


class RunDirInUse(ConfigError):
    """The output directory is held by another live run (the message names it, the holder and
    the overrides that choose another directory)."""


@dataclass
class _Hold:
    fd: int
    #: Taken by the script's Hydra callback: the run in this process may take it once more.
    shared: bool
    runs: int = 0


_HELD: dict[str, _Hold] = {}
_GUARD = threading.Lock()


def _unusable(d: Path, keys: str, e: OSError) -> ConfigError:
    """Why ``d`` cannot hold a run (a path through a file, /proc, a read-only or full file
    system), said before anything runs, as a config error naming the setting to change."""
    through = next((p for p in [d, *d.parents] if p.is_file()), None)
    why = (
        f"{str(through)!r} is a file, not a directory"
        if through is not None
        else f"{type(e).__name__}: {e.strerror or e}"
    )
    return ConfigError(
        f"the output directory {str(d)!r} cannot be made or written ({why}): choose one you can "
        f"write with {keys}"
    )


def _acquire(path: str | Path, keys: str, shared: bool = False) -> str:
    """Hold directory ``path`` (made if missing); returns the key to :func:`_release` it."""
    d = Path(path).expanduser()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unusable(d, keys, e) from None
    key = os.path.realpath(d)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            if held.shared and held.runs == 0 and not shared:
                held.runs = 1  # the script's run takes the directory its callback holds
                return key
            raise _in_use(d, keys, "another run in this process")
        try:
            fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _unusable(d, keys, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _in_use(d, keys, holder) from None
        except BaseException:
            os.close(fd)
            raise
        stamp = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, stamp.encode(), 0)
        _HELD[key] = _Hold(fd, shared)
    return key


def _release(key: str, shared: bool = False) -> None:
    """Let go of what :func:`_acquire` returned ``key`` for (the kernel's lock with the last)."""
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        if held.shared and not shared:
            held.runs = 0
            return
        del _HELD[key]
        os.close(held.fd)  # closing the only descriptor releases the flock


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (``pid 12 on host, since 10:01:02``)."""
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "a process"
    except OSError:
        return "a process"


def _in_use(d: Path, keys: str, holder: str) -> RunDirInUse:
    return RunDirInUse(
        f"{d} is held by another live run ({holder}): two runs in one directory would write "
        f"over each other's files. Wait for it to end, or pass another directory: {keys}",
        key=keys.split("=")[0],
    )


@contextlib.contextmanager
def hold_run_dir(path: str | Path, setting: str) -> Iterator[Path]:
    """Hold output directory ``path`` (made if missing) for the block; ``setting`` is the config
    key that chooses it (``rollout.output_dir``, ``trainer.output_dir``), named in the refusal.

    Raises:
        RunDirInUse: another live run holds it (released by its process's end, however it ends).
    """
    d = Path(path)
    key = _acquire(d, f"{setting}=<dir> (or hydra.run.dir=<dir>)")
    try:
        yield d
    finally:
        _release(key)


class HoldRunDir:
    """Hydra callback (configs/*.yaml): holds ``hydra.run.dir`` (or ``hydra.sweep.dir``) from
    before Hydra writes into it until the run ends; ``setting``: the config key that moves the
    run's outputs elsewhere, named in the refusal."""

    def __init__(self, setting: str | None = None) -> None:
        self.setting = setting
        self._key: str | None = None

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        other = f" (or {self.setting}=<dir>)" if self.setting else ""
        self._hold(str(config.hydra.run.dir), f"hydra.run.dir=<dir>{other}")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._hold(str(config.hydra.sweep.dir), "hydra.sweep.dir=<dir>")

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        self._let_go()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self._let_go()

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        pass

    def on_job_end(self, config: Any, **kwargs: Any) -> None:
        pass

    def _hold(self, path: str, keys: str) -> None:
        """Hold ``path``; refused, end the process as a config error does (Hydra turns what a
        callback raises into a warning and runs the job anyway)."""
        try:
            self._key = _acquire(path, keys, shared=True)
        except ConfigError as e:  # held by another run, or a directory that cannot be made
            sys.stderr.write(f"Config error: {e}\n")
            sys.stderr.flush()
            raise SystemExit(CONFIG_ERROR_EXIT) from None

    def _let_go(self) -> None:
        if self._key is not None:
            _release(self._key, shared=True)
            self._key = None
