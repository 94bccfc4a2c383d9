"""The step watchdog also ends a worker whose env call holds the GIL (a catastrophic regular
expression): its thread cannot run then, so a guard process reads the call marks and SIGKILLs the
worker and the processes it started. ``tests/rollout/test_fail_safe_bounds.py`` runs the same
fault through a rollout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_memory.rollout.worker.watchdog import CallMarks

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's /proc")

WORKER = """
import os, re, subprocess, sys
from agent_memory.rollout.worker.watchdog import CallMarks, CallWatchdog
marks = CallMarks(sys.argv[1], num_envs=8)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
CallWatchdog(marks, limit_s=0.3, interval=0.05)
marks.playing(5, "g2-t1")
marks.start(5, "step")
re.match(r"(a+)+$", "a" * 64 + "b")  # hours in C code, never releasing the GIL
print("returned", flush=True)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_call_holding_the_gil_is_ended_from_outside(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    (child,) = map(int, out.stdout.split())  # never "returned"
    ((env, phase, reason, uid),) = [
        (c.env, c.phase, c.reason, c.traj_uid) for c in CallMarks(tmp_path, 8).collect()
    ]
    assert (env, phase, reason, uid) == (5, "step", "timeout", "g2-t1")
    # The processes it started die with it (sent SIGKILL before the worker was).
    deadline = time.monotonic() + 60
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_the_guard_ends_with_its_worker(tmp_path):
    code = """
    import sys
    from agent_memory.rollout.worker.watchdog import CallMarks, CallWatchdog
    dog = CallWatchdog(CallMarks(sys.argv[1], num_envs=2), limit_s=300)
    print(json.dumps(dog.guard.pid))
    """
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + textwrap.dedent(code), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    guard = json.loads(out.stdout)
    deadline = time.monotonic() + 60  # it checks its parent once a second
    while not _gone(guard) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(guard)
