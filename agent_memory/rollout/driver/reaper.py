"""Ray's processes never outlive the run that started them, also when its driver is SIGKILLed.

Ray ends its GCS and raylet with the driver (they get a parent-death signal), but the agents the
raylet starts (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are orphaned and live on. A
local instance therefore starts with a *reaper*: a small process (the standard library only, its
own session, so a terminal's Ctrl-C leaves it to do its job) that reads a pipe from the driver.
While the pipe is open it notes the instance's processes every few seconds: those whose
environment holds the run's marker (set while Ray starts, inherited by everything Ray spawns) and
their descendants. When the pipe closes (:meth:`Reaper.release`, or the driver's death, however
it died) it ends what is left of them (SIGTERM, then SIGKILL; a pid reused since is left alone)
and removes the instance's private directory.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["MARKER", "REAPER", "Reaper"]

#: The environment variable whose value (the instance's directory) marks its processes.
MARKER = "AGENT_MEMORY_RAY_RUN"

#: The reaper (``python -I -S -c REAPER root``): stdin is the driver's pipe.
REAPER = f"""
import os, select, shutil, signal, sys, time
root = sys.argv[1]
mark = b"{MARKER}=" + root.encode() + b"\\0"

def read(pid, name):
    with open(f"/proc/{{pid}}/{{name}}", "rb") as f:
        return f.read()

def stat(pid):  # (ppid, start time, state)
    s = read(pid, "stat")
    fields = s[s.rfind(b")") + 2 :].split()
    return int(fields[1]), fields[19], fields[0]

def note(seen):
    procs, kids, todo = {{}}, {{}}, []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            procs[pid] = stat(pid)
            if mark in read(pid, "environ"):
                todo.append(pid)
        except OSError:
            continue
        kids.setdefault(procs[pid][0], []).append(pid)
    done = set()
    while todo:
        pid = todo.pop()
        if pid not in done:
            done.add(pid)
            seen[pid] = procs[pid][1]
            todo += kids.get(pid, [])

def alive(pid, start):
    try:
        _, now, state = stat(pid)
    except OSError:
        return False
    return now == start and state != b"Z"

signal.signal(signal.SIGINT, signal.SIG_IGN)
seen = {{}}
while True:
    ready, _, _ = select.select([0], [], [], 5.0)
    if ready and not os.read(0, 64):
        break
    note(seen)
note(seen)
for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
    live = [p for p, s in seen.items() if alive(p, s)]
    for pid in live:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while live and time.monotonic() < end:
        time.sleep(0.05)
        live = [p for p in live if alive(p, seen[p])]
shutil.rmtree(root, ignore_errors=True)
"""


class Reaper:
    """The reaper of the processes marked with ``root`` (see the module); Linux only.

    Args:
        root: the instance's private directory (removed when the reaper ends).

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> r = Reaper(root)
        >>> r.noted()  # the instance started: note its processes now
        >>> r.release()
        0
        >>> os.path.exists(root)
        False
    """

    def __init__(self, root: str) -> None:
        self.root = root
        read, self._pipe = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", REAPER, root],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)

    def noted(self) -> None:
        """Have the reaper note the instance's processes now (rather than at its next look)."""
        os.write(self._pipe, b"n")

    def release(self, timeout: float = 30.0) -> int | None:
        """End what is left of the instance, remove its directory; the reaper's exit status."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:  # it goes on alone; nothing waits for it
            return None
