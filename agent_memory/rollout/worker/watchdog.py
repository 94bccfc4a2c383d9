"""Which env a worker process was inside when it died, and a time limit on every env call.

A rollout worker runs many sub-envs in one process, so when the process dies (``os._exit`` in a
simulator, a segfault, the OOM killer, a kill) every episode on it is interrupted — but usually
one env did it. :class:`CallMarks` tells which: each sub-env is wrapped in :class:`MarkCalls`,
which writes ``"<phase> <start time>"`` into the env's own small file before ``reset``/``step``
and blanks it when the call returns or raises; the worker also writes which episode each env
plays (:meth:`CallMarks.playing`, the file's second field). A mark that is still there after the
process died names the env that took it down, and its episode; the worker's next incarnation
reads the marks (:meth:`CallMarks.collect`) and the driver charges only that episode an attempt.

:class:`CallWatchdog` enforces ``rollout.step_timeout_s``: a daemon thread of the worker process
reads the marks every ``interval`` seconds; a call older than the limit is re-marked as a timeout
and the process ends itself (after killing the sub-env processes of an async vector env). A call
stuck in C code cannot be interrupted any other way; Ray then restarts the worker and the driver
ends that episode with the timeout.

The files live on the worker's machine (``tempfile.gettempdir()``), one directory per run and
worker. Each process maps the files it writes (``mmap``, shared): a mark is a 64-byte store into
the page cache, no system call (so the env step never gives up the GIL for it), and it outlives
a process that dies, as a written file does.

Example:
    >>> import tempfile
    >>> marks = CallMarks(tempfile.mkdtemp(), num_envs=2)
    >>> marks.playing(1, "g3-t0")
    >>> marks.start(1, "step")  # the process "dies" here, inside env 1's step
    >>> [(c.env, c.phase, c.reason, c.traj_uid) for c in CallMarks(marks.root, 2).collect()]
    [(1, 'step', 'died', 'g3-t0')]
    >>> CallMarks(marks.root, num_envs=2).collect()  # collected once
    ()
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, SupportsFloat

import gymnasium as gym

from agent_memory.rollout.messages import CrashReport

__all__ = ["CallMarks", "CallWatchdog", "MarkCalls"]

_SIZE = 64
_BLANK = b" " * _SIZE
Phase = Literal["reset", "step"]


def _encode(*fields: object) -> bytes:
    return " ".join(str(f) for f in fields).encode().ljust(_SIZE)[:_SIZE]


class CallMarks:
    """The mark files of one worker's ``num_envs`` sub-envs, under ``root``.

    A mark is ``"<phase> <start>"`` while a call runs, ``"timeout <phase> <start> <seconds>"``
    once the watchdog gave up on it, and blank otherwise; the second field of the file is the
    episode the env plays. Instances are cheap and picklable: each process (the worker, or an
    async vector env's sub-env process) maps the files it writes.
    """

    def __init__(self, root: str | os.PathLike[str], num_envs: int) -> None:
        self.root = str(root)
        self.num_envs = num_envs
        self._maps: dict[int, mmap.mmap] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "num_envs": self.num_envs, "_maps": {}}

    def _map(self, env: int) -> mmap.mmap:
        m = self._maps.get(env)
        if m is None:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            fd = os.open(os.path.join(self.root, f"env-{env}"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size < 2 * _SIZE:  # a new file: blank fields (a map needs the bytes)
                    os.pwrite(fd, b" " * (2 * _SIZE - size), size)
                m = mmap.mmap(fd, 2 * _SIZE)
            finally:
                os.close(fd)  # the map keeps the file
            self._maps[env] = m
        return m

    def start(self, env: int, phase: Phase) -> None:
        """Env ``env`` enters ``phase``."""
        # (Written on every env call: one format, no generic encoding.)
        self._map(env)[:_SIZE] = f"{phase} {time.time():.6f}".encode().ljust(_SIZE)

    def end(self, env: int) -> None:
        """Env ``env``'s call returned (or raised)."""
        self._map(env)[:_SIZE] = _BLANK

    def playing(self, env: int, traj_uid: str) -> None:
        """Env ``env`` starts episode ``traj_uid`` (written before its reset; a uid longer
        than the field is not written: the report then names no episode)."""
        tag = traj_uid.encode()
        self._map(env)[_SIZE:] = tag.ljust(_SIZE) if len(tag) <= _SIZE else _BLANK

    def episode(self, env: int) -> str | None:
        """The episode env ``env`` was last said to play (None when none was)."""
        return self._field(env, 1).strip() or None

    def read(self, env: int) -> list[str]:
        """The fields of env ``env``'s mark ([] when blank or absent)."""
        return self._field(env, 0).split()

    def _field(self, env: int, k: int) -> str:
        """Field ``k`` of env ``env``'s file as text, read from disk ("" when absent): what a
        process that died left there, too."""
        try:
            with open(os.path.join(self.root, f"env-{env}"), "rb") as f:
                f.seek(k * _SIZE)
                return f.read(_SIZE).decode(errors="replace")
        except FileNotFoundError:
            return ""

    def give_up(self, env: int, fields: list[str]) -> None:
        """Re-mark env ``env``'s running call (``fields``, as read) as timed out."""
        phase, start = fields[0], float(fields[1])
        self._map(env)[:_SIZE] = _encode("timeout", phase, start, f"{time.time() - start:.3f}")

    def collect(self) -> tuple[CrashReport, ...]:
        """The calls a dead process left unfinished (then blanks every mark)."""
        reports = []
        for env in range(self.num_envs):
            fields = self.read(env)
            with contextlib.suppress(ValueError, IndexError):
                if fields and fields[0] == "timeout":
                    reports.append(
                        CrashReport(env, fields[1], "timeout", float(fields[3]), self.episode(env))  # type: ignore[arg-type]
                    )
                elif fields:
                    seconds = round(time.time() - float(fields[1]), 3)
                    reports.append(CrashReport(env, fields[0], "died", seconds, self.episode(env)))  # type: ignore[arg-type]
            if fields:
                self.end(env)
        return tuple(reports)

    def close(self, remove: bool = False) -> None:
        """Close the open files; ``remove`` deletes the directory."""
        for m in self._maps.values():
            with contextlib.suppress(OSError, ValueError):
                m.close()
        self._maps.clear()
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)


class MarkCalls(gym.Wrapper):
    """Marks sub-env ``env``'s ``reset`` and ``step`` calls in ``marks`` (see the module)."""

    def __init__(self, env: gym.Env, marks: CallMarks, index: int) -> None:
        super().__init__(env)
        self.marks = marks
        self.index = index

    # try/finally rather than a context manager: this runs around every env call.
    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.marks.start(self.index, "reset")
        try:
            return self.env.reset(**kwargs)
        finally:
            self.marks.end(self.index)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.marks.start(self.index, "step")
        try:
            return self.env.step(action)
        finally:
            self.marks.end(self.index)


class CallWatchdog:
    """Ends the process when an env call has run longer than ``limit_s`` (see the module).

    Args:
        marks: the worker's marks.
        limit_s: the longest an env's ``reset`` or ``step`` may run, in seconds.
        before_exit: called before the process ends (e.g. kill the sub-env processes).
        interval: seconds between checks (default: a quarter of the limit, at most 1 s).
    """

    def __init__(
        self,
        marks: CallMarks,
        limit_s: float,
        before_exit: Callable[[], None] | None = None,
        interval: float | None = None,
    ) -> None:
        self.marks = marks
        self.limit_s = float(limit_s)
        self.before_exit = before_exit
        self.interval = interval if interval is not None else min(1.0, self.limit_s / 4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-memory-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.time()
            for env in range(self.marks.num_envs):
                fields = self.marks.read(env)
                if len(fields) != 2:
                    continue
                try:
                    late = now - float(fields[1]) > self.limit_s
                except ValueError:
                    continue
                if late and self.marks.read(env) == fields:  # still the same call
                    self.marks.give_up(env, fields)
                    if self.before_exit is not None:
                        with contextlib.suppress(Exception):
                            self.before_exit()
                    os._exit(70)  # EX_SOFTWARE: Ray restarts the worker

    def stop(self) -> None:
        """Stop checking (the worker is closing)."""
        self._stop.set()


def kill_processes(processes: list[Any]) -> None:
    """SIGKILL ``multiprocessing`` processes (an async vector env's sub-envs) that still run."""
    for p in processes:
        with contextlib.suppress(Exception):
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
