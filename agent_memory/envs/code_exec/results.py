"""What a sandbox may use (:class:`SandboxLimits`) and what one run gives back (:class:`RunResult`).

The result is read from the supervisor's frame without trusting it (:func:`parse_result`), and a
process's end is put in words for the observation (:func:`describe_exit`). Kept apart from
:mod:`~agent_memory.envs.code_exec.sandbox`, which runs the processes and speaks to them.

Example:
    >>> RunResult("ok", head="42\\n").text
    '42\\n'
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Literal

from agent_memory.envs.code_exec.sandbox_child import protocol

__all__ = [
    "CGROUP_HEADROOM_MB",
    "RunResult",
    "SandboxLimits",
    "Status",
    "describe_exit",
    "parse_result",
]

#: The cgroup's memory total is ``memory_mb`` plus this (the supervisor, kernel memory).
CGROUP_HEADROOM_MB = 64

Status = Literal["ok", "error", "timeout", "died", "quota"]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox.

    Attributes:
        timeout_s: wall-clock seconds per :meth:`Sandbox.run`; over it the process restarts.
        cpu_s: ``RLIMIT_CPU`` seconds, cumulative over the process's life (a backstop).
        memory_mb: ``RLIMIT_AS`` of each process in MiB; the cgroup allows the whole sandbox
            ``memory_mb + CGROUP_HEADROOM_MB``, so a process gets a clean ``MemoryError`` first.
        file_size_mb: ``RLIMIT_FSIZE`` in MiB (largest file the code may write).
        disk_mb: the working dir's total in MiB (each file and directory counted as at least
            4 KiB); over it the sandbox closes, removing the files (status ``"quota"``).
        output_chars: characters of output kept at the head and at the tail of each run.
        open_files: ``RLIMIT_NOFILE``.
        processes: tasks (processes and threads) alive at once in the whole sandbox (the
            cgroup's ``pids.max`` and ``RLIMIT_NPROC``).
    """

    timeout_s: float = 10.0
    cpu_s: int = 30
    memory_mb: int = 512
    file_size_mb: int = 16
    disk_mb: int = 64
    output_chars: int = 4000
    open_files: int = 256
    processes: int = 32


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one :meth:`Sandbox.run` produced.

    Attributes:
        status: ``"ok"``, ``"error"`` (an exception, traceback in the text), ``"timeout"``,
            ``"died"`` (the process ended: a limit, a crash, ``os._exit``, a broken frame) or
            ``"quota"`` (the working dir went over ``disk_mb``: the sandbox is closed).
        head: the first characters of the output (stdout and stderr, then a trailing
            expression's repr or the traceback).
        tail: the last characters of the output.
        omitted: characters dropped between head and tail.
        names: ``(name, type name)`` of the user-visible namespace after the run.
        restarted: the process was replaced: earlier variables and imports are gone.
        note: why it was restarted, for the observation.
    """

    status: Status
    head: str = ""
    tail: str = ""
    omitted: int = 0
    names: tuple[tuple[str, str], ...] = ()
    restarted: bool = False
    note: str = ""

    @property
    def text(self) -> str:
        """Head and tail joined with a marker when something was dropped."""
        if not self.omitted:
            return self.head + self.tail
        return f"{self.head}\n[... {self.omitted} characters omitted ...]\n{self.tail}"


def parse_result(msg: dict, seq: int, cap: int) -> RunResult | None:
    """The :class:`RunResult` in a result frame for run ``seq``; None if the frame is not one.

    Never raises, whatever ``msg`` holds.

    Example:
        >>> parse_result({"op": "result", "seq": 1, "status": "ok", "head": "hi\\n", "tail": "",
        ...               "omitted": 0, "names": [["x", "int"]]}, seq=1, cap=100).names
        (('x', 'int'),)
        >>> parse_result({"op": "result", "seq": 1, "omitted": "many"}, seq=1, cap=100) is None
        True
    """
    clean = protocol.clean_result(msg, seq, cap)
    if clean is None:
        return None
    return RunResult(
        status=clean["status"],
        head=clean["head"],
        tail=clean["tail"],
        omitted=clean["omitted"],
        names=tuple((name, kind) for name, kind in clean["names"]),
    )


def describe_exit(code: int | None, limits: SandboxLimits) -> str:
    """Why a sandbox process ended, in words for the observation, from its exit ``code``
    (``Popen.returncode``: negative for a signal; None when it did not exit).

    Example:
        >>> describe_exit(-9, SandboxLimits())
        'it was killed (SIGKILL; possibly out of memory)'
    """
    if code is None:
        return "it did not exit"
    if code >= 0:
        return f"it exited with code {code}"
    sig = -code
    if sig == signal.SIGXCPU:
        return f"it used up its CPU-time limit ({limits.cpu_s} s per process)"
    name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
    if sig == signal.SIGKILL:
        return f"it was killed ({name}; possibly out of memory)"
    if sig == signal.SIGSYS:
        return f"it was killed by signal {name} (a refused system call)"
    return f"it was killed by signal {name}"
