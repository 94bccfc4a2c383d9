"""Which env a worker process was inside when it died, and a time limit on every env call.

A dying worker interrupts all its episodes, but one env usually did it: :class:`MarkCalls` marks
each sub-env's ``reset``/``step`` (and episode) in a memory-mapped file, so the next process reads
which episode was inside a call (:meth:`CallMarks.collect`) and charges only that one.
:class:`CallWatchdog` enforces ``rollout.step_timeout_s``: a stuck call cannot be interrupted, so
the process marks it a timeout and ends itself (Ray restarts it); for a call that holds the GIL,
a guard process (:mod:`.guard`) does the same from outside.

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
import fcntl
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, SupportsFloat

import gymnasium as gym

from agent_memory.rollout.messages import CrashReport

__all__ = ["CallMarks", "CallWatchdog", "MarkCalls"]

_SIZE = 64  # bytes of a field
_SLOT = 2 * _SIZE  # an env's slot in the file: its mark, then its episode
_BLANK = b" " * _SIZE
_FILE = "marks"
_NONBLANK = re.compile(rb"[^ \x00]")  # bytes no process wrote are zeros: blank too
Phase = Literal["reset", "step"]


def _encode(*fields: object) -> bytes:
    return " ".join(str(f) for f in fields).encode().ljust(_SIZE)[:_SIZE]


class CallMarks:
    """The marks of one worker's ``num_envs`` sub-envs, in one file under ``root``.

    Env ``i`` owns bytes ``[128 i, 128 i + 128)``: its mark (``"<phase> <start>"`` in a call,
    ``"timeout <phase> <start> <seconds>"`` once given up on, else blank), then its episode. The
    file is mapped once per process: a mark is a store into memory that outlives the process.
    """

    def __init__(self, root: str | os.PathLike[str], num_envs: int) -> None:
        self.root = str(root)
        self.num_envs = num_envs
        self._setup()

    def _setup(self) -> None:
        self._m: mmap.mmap  # the current map (set once _end > 0)
        self._end = 0  # bytes of the file it maps (whole slots)
        self._maps: list[mmap.mmap] = []  # every map made (a reader may hold an outgrown one)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "num_envs": self.num_envs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _map(self, env: int) -> mmap.mmap:
        """The map, made or grown to hold env ``env``'s slot (not on the path of a step)."""
        with self._lock:
            if (env + 1) * _SLOT <= self._end:  # another thread grew it
                return self._m
            need = max(env + 1, self.num_envs, 2 * self._end // _SLOT) * _SLOT
            Path(self.root).mkdir(parents=True, exist_ok=True)
            fd = os.open(os.path.join(self.root, _FILE), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # grown by one process at a time, never shrunk
                try:
                    size = os.fstat(fd).st_size
                    if size < need:
                        try:  # zeros, with their disk blocks (no SIGBUS on a full disk)
                            os.posix_fallocate(fd, size, need - size)
                        except (AttributeError, OSError):
                            os.ftruncate(fd, need)
                        size = need
                finally:  # before the map: its copy of the descriptor would keep the lock
                    fcntl.flock(fd, fcntl.LOCK_UN)
                m = mmap.mmap(fd, size - size % _SLOT)
            finally:
                os.close(fd)  # the map keeps the file
            self._maps.append(m)
            self._m = m  # (before _end: a reader that sees the new end finds the new map)
            self._end = len(m)
            return m

    def start(self, env: int, phase: Phase) -> None:
        """Env ``env`` enters ``phase``."""
        # Written on every env call: one format, no generic encoding, no function call.
        o = env * _SLOT
        m = self._m if o < self._end else self._map(env)
        m[o : o + _SIZE] = f"{phase} {time.time():.6f}".encode().ljust(_SIZE)

    def end(self, env: int) -> None:
        """Env ``env``'s call returned (or raised)."""
        o = env * _SLOT
        m = self._m if o < self._end else self._map(env)
        m[o : o + _SIZE] = _BLANK

    def playing(self, env: int, traj_uid: str) -> None:
        """Env ``env`` starts episode ``traj_uid`` (written before its reset; a uid longer
        than the field is not written: the report then names no episode)."""
        tag = traj_uid.encode()
        self._write(env, 1, tag.ljust(_SIZE) if len(tag) <= _SIZE else _BLANK)

    def episode(self, env: int) -> str | None:
        """The episode env ``env`` was last said to play (None when none was)."""
        return self._field(env, 1).strip() or None

    def read(self, env: int) -> list[str]:
        """The fields of env ``env``'s mark ([] when blank)."""
        return self._field(env, 0).split()

    def _write(self, env: int, k: int, data: bytes) -> None:
        o = env * _SLOT + k * _SIZE
        m = self._m if o < self._end else self._map(env)
        m[o : o + _SIZE] = data

    def _field(self, env: int, k: int) -> str:
        """Field ``k`` of env ``env``'s slot as text (what any process wrote, a dead one too)."""
        o = env * _SLOT + k * _SIZE
        m = self._m if o < self._end else self._map(env)
        return m[o : o + _SIZE].replace(b"\0", b" ").decode(errors="replace")

    def running(self) -> list[tuple[int, list[str]]]:
        """``(env, fields)`` of every env whose mark is not blank, in order (what :meth:`read`
        gives; found by a scan of one byte per env)."""
        if self.num_envs <= 0:
            return []
        end = self.num_envs * _SLOT
        m = self._m if end <= self._end else self._map(self.num_envs - 1)
        hits = _NONBLANK.finditer(m[0:end:_SLOT])  # the first byte of each mark
        return [(hit.start(), self.read(hit.start())) for hit in hits]

    def give_up(self, env: int, fields: list[str]) -> None:
        """Re-mark env ``env``'s running call (``fields``, as read) as timed out."""
        phase, start = fields[0], float(fields[1])
        self._write(env, 0, _encode("timeout", phase, start, f"{time.time() - start:.3f}"))

    def collect(self) -> tuple[CrashReport, ...]:
        """The calls a dead process left unfinished (then blanks every mark)."""
        reports = []
        for env, fields in self.running():
            with contextlib.suppress(ValueError, IndexError):
                if fields[0] == "timeout":
                    phase, reason, seconds = fields[1], "timeout", float(fields[3])
                else:
                    seconds = round(time.time() - float(fields[1]), 3)
                    phase, reason = fields[0], "died"
                reports.append(CrashReport(env, phase, reason, seconds, self.episode(env)))  # type: ignore[arg-type]
            self.end(env)
        return tuple(reports)

    def close(self, remove: bool = False) -> None:
        """Unmap the file; ``remove`` deletes the directory."""
        with self._lock:
            for m in self._maps:
                with contextlib.suppress(OSError, ValueError, BufferError):
                    m.close()
            self._maps.clear()
            self._end = 0
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


#: The guard process's program (:mod:`.guard`): a module of the standard library only, run by
#: its path under ``python -I -S`` (milliseconds and a few MB, none of the package's imports).
_GUARD = str(Path(__file__).with_name("guard.py"))


class CallWatchdog:
    """Ends the process when an env call has run longer than ``limit_s`` (see the module).

    A thread checks the marks every ``interval`` and ends the process (status 70, after
    ``before_exit``); a guard process (:mod:`.guard`) kills it ``grace`` seconds later still.

    Args:
        limit_s: the longest an env's ``reset`` or ``step`` may run, in seconds.
        before_exit: called before the process ends (e.g. kill the sub-env processes).
        interval: seconds between checks (default: a quarter of the limit, at most 1 s).
        grace: seconds past ``limit_s`` before the guard process kills (default: two
            intervals, at least 1 s); None: no guard process.
    """

    def __init__(
        self,
        marks: CallMarks,
        limit_s: float,
        before_exit: Callable[[], None] | None = None,
        interval: float | None = None,
        grace: float | None = -1.0,
    ) -> None:
        self.marks = marks
        self.limit_s = float(limit_s)
        self.before_exit = before_exit
        self.interval = interval if interval is not None else min(1.0, self.limit_s / 4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-memory-watchdog", daemon=True)
        self._thread.start()
        if grace is not None and grace < 0:
            grace = max(1.0, 2 * self.interval)
        self.guard = None if grace is None else self._start_guard(self.limit_s + grace)

    def _start_guard(self, limit_s: float) -> subprocess.Popen[bytes] | None:
        """The guard process (None where it cannot run: no /proc, or it does not start)."""
        if not os.path.isdir(f"/proc/{os.getpid()}/task"):
            return None
        self.marks._map(max(0, self.marks.num_envs - 1))  # the file exists before the guard
        args = [os.path.join(self.marks.root, _FILE), str(limit_s), str(self.interval)]
        layout = [str(os.getpid()), str(_SLOT), str(_SIZE)]
        cmd = [sys.executable, "-I", "-S", _GUARD, *args, *layout]
        try:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except OSError:  # no guard: the thread alone (a call holding the GIL is not ended)
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._check()
            except (ValueError, OSError):  # the marks were closed under the last check
                if not self._stop.is_set():
                    raise

    def _check(self) -> None:
        now = time.time()
        for env, fields in self.marks.running():
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
        if self.guard is not None:
            with contextlib.suppress(OSError):
                self.guard.kill()
                self.guard.wait()


def kill_processes(processes: list[Any]) -> None:
    """SIGKILL ``multiprocessing`` processes (an async vector env's sub-envs) that still run."""
    for p in processes:
        with contextlib.suppress(Exception):
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
