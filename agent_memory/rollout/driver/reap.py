"""The reaper's process: ends what is left of a local Ray instance once its driver is gone.

Started by :class:`~agent_memory.rollout.driver.reaper.Reaper` as ``python -I -S reap.py NAME
ROOT`` (or ``python -m``) with the driver's pipe as stdin; standard library only, so it starts in
milliseconds. While the pipe is open it notes the processes whose environment holds ``NAME=ROOT``
and their descendants; when it closes it sends SIGTERM, then SIGKILL, to those alive (not to a
reused pid) and removes ``ROOT``.

Example:
    >>> import os
    >>> seen: dict[int, bytes] = {}
    >>> note(seen, b"NO_SUCH_MARK=\\0")  # no process carries it
    >>> seen, alive(os.getpid(), stat(os.getpid())[1])
    ({}, True)
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time

__all__ = ["alive", "main", "note", "stat"]

#: Seconds between two looks at the processes while the driver's pipe stays quiet.
LOOK_S = 5.0
#: Seconds each signal (SIGTERM, then SIGKILL) is given before the next.
SIGNAL_WAITS = ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0))


def _read(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def stat(pid: int) -> tuple[int, bytes, bytes]:
    """``(parent pid, start time, state)`` of ``pid`` from ``/proc/<pid>/stat``.

    Raises:
        OSError: the process is gone (or not readable).
    """
    s = _read(pid, "stat")
    fields = s[s.rfind(b")") + 2 :].split()
    return int(fields[1]), fields[19], fields[0]


def note(seen: dict[int, bytes], mark: bytes) -> None:
    """Add to ``seen`` (pid -> start time) every process whose environment holds ``mark``
    (``b"NAME=value\\0"``) and every descendant of one, this process excepted."""
    procs: dict[int, tuple[int, bytes, bytes]] = {}
    kids: dict[int, list[int]] = {}
    todo: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            procs[pid] = stat(pid)
            if mark in _read(pid, "environ"):
                todo.append(pid)
        except OSError:
            continue
        kids.setdefault(procs[pid][0], []).append(pid)
    done: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in done:
            done.add(pid)
            seen[pid] = procs[pid][1]
            todo += kids.get(pid, [])


def alive(pid: int, start: bytes) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and not a zombie."""
    try:
        _, now, state = stat(pid)
    except OSError:
        return False
    return now == start and state != b"Z"


def _end(seen: dict[int, bytes]) -> None:
    """SIGTERM, then SIGKILL, the processes of ``seen`` still alive, each a moment apart."""
    for sig, wait in SIGNAL_WAITS:
        live = [p for p, s in seen.items() if alive(p, s)]
        for pid in live:
            with contextlib.suppress(OSError):  # gone since
                os.kill(pid, sig)
        end = time.monotonic() + wait
        while live and time.monotonic() < end:
            time.sleep(0.05)
            live = [p for p in live if alive(p, seen[p])]


def main(argv: list[str]) -> int:
    """Reap the processes marked ``argv[0]=argv[1]`` (the variable's name, the instance's
    directory); stdin is the driver's pipe."""
    if len(argv) != 2:
        print("usage: python -I -S reap.py NAME ROOT  (stdin: the driver's pipe)", file=sys.stderr)
        return 2
    name, root = argv
    mark = f"{name}={root}\0".encode()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C leaves it to its job
    seen: dict[int, bytes] = {}
    while True:
        ready, _, _ = select.select([0], [], [], LOOK_S)
        if ready and not os.read(0, 64):
            break
        note(seen, mark)
    note(seen, mark)
    _end(seen)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
