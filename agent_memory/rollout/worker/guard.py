"""The watchdog's guard process: ends a worker whose env call has held the GIL past its limit.

Started by :class:`~agent_memory.rollout.worker.watchdog.CallWatchdog` as ``python -I -S
guard.py PATH LIMIT INTERVAL PID SLOT SIZE`` (or ``python -m``): standard library only, so it
starts in milliseconds (and the marks' layout comes on the command line). Every ``INTERVAL``
seconds it scans the marks file ``PATH`` (``SLOT`` bytes per env, the mark in the first ``SIZE``);
a call older than ``LIMIT`` seconds is marked a timeout (as ``CallMarks.give_up`` does) and the
worker's child processes, then the worker ``PID``, are SIGKILLed. It ends when the worker is gone.

Example:
    >>> marks = b" " * 128 + b"step 100.000000".ljust(128)  # env 0 idle, env 1 in a step
    >>> late(marks, 101.0, limit=5.0, slot=128, size=64) is None
    True
    >>> late(marks, 106.0, limit=5.0, slot=128, size=64)
    (128, [b'step', b'100.000000'])
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import signal
import sys
import time
from typing import BinaryIO

__all__ = ["late", "main", "timed_out"]

_BUSY = re.compile(rb"[^ \x00]")  # bytes no process wrote are zeros: blank too
_USAGE = "usage: python -I -S guard.py PATH LIMIT INTERVAL PID SLOT SIZE"


def late(
    m: bytes | mmap.mmap, now: float, *, limit: float, slot: int, size: int
) -> tuple[int, list[bytes]] | None:
    """The first call in the marks ``m`` (``slot`` bytes per env, a mark of ``size`` first)
    running longer than ``limit`` seconds at ``now``: ``(offset of its mark, its fields)``, or
    None when there is none."""
    for hit in _BUSY.finditer(m[0 : len(m) : slot]):
        o = hit.start() * slot
        fields = m[o : o + size].replace(b"\0", b" ").split()
        if (
            len(fields) == 2
            and fields[1].replace(b".", b"", 1).isdigit()
            and now - float(fields[1]) > limit
        ):
            return o, fields
    return None


def timed_out(phase: bytes, start: bytes, seconds: float, size: int) -> bytes:
    """The mark (``size`` bytes) of a call given up on after ``seconds``.

    Example:
        >>> timed_out(b"step", b"100.000000", 5.5, size=64).rstrip()
        b'timeout step 100.000000 5.500'
    """
    return f"timeout {phase.decode()} {start.decode()} {seconds:.3f}".encode().ljust(size)[:size]


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (this one excepted)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split() if int(c) != os.getpid()]
    return found


def _give_up(f: BinaryIO, limit: float, slot: int, size: int) -> bool:
    """Re-mark the first call in the marks file ``f`` that is past ``limit``; whether one was
    (and was still the same call when re-marked)."""
    total = os.fstat(f.fileno()).st_size
    if total < slot:
        return False
    with mmap.mmap(f.fileno(), total - total % slot) as m:
        now = time.time()
        hit = late(m, now, limit=limit, slot=slot, size=size)
        if hit is None or m[hit[0] : hit[0] + size].replace(b"\0", b" ").split() != hit[1]:
            return False
        o, (phase, start) = hit
        m[o : o + size] = timed_out(phase, start, now - float(start), size)
        m.flush()
    return True


def main(argv: list[str]) -> int:
    """Guard the worker ``PID`` (see the module); returns when it is gone or killed."""
    if len(argv) != 6:
        print(_USAGE, file=sys.stderr)
        return 2
    path, limit, interval = argv[0], float(argv[1]), float(argv[2])
    pid, slot, size = int(argv[3]), int(argv[4]), int(argv[5])
    with open(path, "r+b") as f:  # kept open: the file outlives its directory's removal
        while os.getppid() == pid:
            time.sleep(interval)
            if not _give_up(f, limit, slot, size):
                continue
            try:
                kids = _children(pid)
            except OSError:
                kids = []
            for kid in kids:
                with contextlib.suppress(OSError):
                    os.kill(kid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
