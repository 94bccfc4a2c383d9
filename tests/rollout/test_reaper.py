"""The reaper (``agent_memory/rollout/driver/reap.py``) without Ray: it ends the marked processes
and their descendants, leaves the others alone, and removes the instance's directory.
``tests/rollout/test_ray_local.py::test_no_ray_process_outlives_a_sigkilled_driver`` runs it
under a real Ray instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_memory.rollout.driver.reaper import MARKER, Reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="Linux's /proc")

#: A marked process that starts an unmarked child (its environment emptied), prints its pid.
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={})\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_the_reaper_ends_marked_processes_and_their_children_and_removes_the_root(tmp_path):
    root = tmp_path / "instance"
    root.mkdir()
    marked = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        env={**os.environ, MARKER: str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        grandchild = int(marked.stdout.readline())
        reaper = Reaper(str(root))
        reaper.noted()
        assert reaper.release() == 0  # (run under -I -S: the standard library alone imports)
        assert marked.wait(timeout=60) == -signal.SIGTERM
        deadline = time.monotonic() + 60
        while not _gone(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(grandchild)
        assert other.poll() is None  # not marked: left alone
        assert not root.exists()
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "module", ["agent_memory.rollout.driver.reap", "agent_memory.rollout.worker.guard"]
)
def test_the_programs_run_as_modules_and_say_their_usage(module):
    out = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("usage: python -I -S ")
