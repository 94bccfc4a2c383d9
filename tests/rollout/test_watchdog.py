"""Call marks and the step watchdog (``agent_memory.rollout.worker.watchdog``), in-process.

The marks must hold for more envs than a process may open files (the async engine keeps tens of
thousands in flight): each test runs its worker in a subprocess whose soft ``RLIMIT_NOFILE`` is
lowered to 256, with more envs than that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from agent_memory.rollout.worker.watchdog import CallMarks

ENVS = 1000  # well above the 256 file handles the subprocesses may hold

PRELUDE = """
import json, os, resource, signal, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from agent_memory.rollout.worker.watchdog import CallMarks, CallWatchdog
root, envs = sys.argv[1], int(sys.argv[2])
"""


def run(code: str, root, *args: object) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(code)
    cmd = [sys.executable, "-c", script, str(root), str(ENVS), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


COLLECT = """
reports = CallMarks(root, envs).collect()
print(json.dumps([[c.env, c.phase, c.reason, c.seconds, c.traj_uid] for c in reports]))
"""


def collect(root) -> list[list]:
    out = run(COLLECT, root)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_marks_of_more_envs_than_file_handles_survive_a_sigkill(tmp_path):
    # Two processes (an async vector env's sub-env processes) mark halves of the envs, then die.
    mark = """
    part = int(sys.argv[3])
    marks = CallMarks(root, envs)
    for env in range(part, envs, 2):
        marks.playing(env, f"g{env}-t0")
        marks.start(env, "step" if env % 3 else "reset")
        if env % 5 == 0:
            marks.end(env)  # returned: no mark
    os.kill(os.getpid(), signal.SIGKILL)
    """
    started = time.monotonic()
    for part in (0, 1):
        out = run(mark, tmp_path, part)
        assert out.returncode == -signal.SIGKILL, out.stderr
    reports = collect(tmp_path)
    lived = time.monotonic() - started + 0.01  # no call ran longer than the test (0.01: clocks)
    expected = [env for env in range(ENVS) if env % 5]
    assert [r[0] for r in reports] == expected
    for env, phase, reason, seconds, uid in reports:
        assert (phase, reason, uid) == ("step" if env % 3 else "reset", "died", f"g{env}-t0")
        assert 0 <= seconds <= lived, (seconds, lived)
    assert collect(tmp_path) == []  # collected once


def test_the_watchdog_ends_a_process_whose_call_outlives_the_limit_among_many_envs(tmp_path):
    hang = """
    marks = CallMarks(root, envs)
    for env in range(envs):
        marks.playing(env, f"g{env}-t1")
        marks.start(env, "step")
        if env != 777:
            marks.end(env)
    def before_exit():
        print("before exit", flush=True)
    CallWatchdog(marks, limit_s=0.3, before_exit=before_exit, interval=0.05)
    while True:  # env 777's step hangs; the others keep stepping
        for env in range(0, envs, 7):
            if env != 777:
                marks.start(env, "step")
                marks.end(env)
        time.sleep(0.001)
    """
    started = time.monotonic()
    out = run(hang, tmp_path)
    assert out.returncode == 70 and out.stdout == "before exit\n", out.stderr
    ((env, phase, reason, seconds, uid),) = collect(tmp_path)
    lived = time.monotonic() - started + 0.01  # (0.01: the two clocks' reading of one instant)
    assert (env, phase, reason, uid) == (777, "step", "timeout", "g777-t1")
    assert 0.3 < seconds <= lived, (seconds, lived)  # past the limit; within the process's life


def test_marks_are_picklable_and_read_what_other_processes_wrote(tmp_path):
    import pickle

    marks = CallMarks(tmp_path, num_envs=3)
    marks.playing(2, "g0-t0")
    copy = pickle.loads(pickle.dumps(marks))
    copy.start(2, "reset")  # another process's map of the same marks
    assert marks.read(2)[0] == "reset" and marks.episode(2) == "g0-t0"
    assert marks.read(0) == [] and marks.episode(0) is None
    copy.end(2)
    assert marks.read(2) == []
    assert marks.collect() == ()
    copy.close()
    marks.close(remove=True)
    assert not os.path.exists(tmp_path)


def test_an_episode_uid_longer_than_its_field_is_not_written(tmp_path):
    marks = CallMarks(tmp_path, num_envs=1)
    marks.playing(0, "g1-t0")
    marks.playing(0, "x" * 65)
    marks.start(0, "step")
    ((report),) = CallMarks(tmp_path, 1).collect()
    assert (report.env, report.phase, report.reason, report.traj_uid) == (0, "step", "died", None)
    marks.close()


def test_the_file_grows_for_an_env_past_its_end_and_every_process_sees_it(tmp_path):
    marks = CallMarks(tmp_path, num_envs=2)
    marks.start(0, "step")
    other = CallMarks(tmp_path, num_envs=2)  # another process's marks, mapped at 2 slots
    assert other.read(0)[0] == "step"
    marks.playing(300, "g9-t9")  # past the end: the file grows (doubling at least)
    marks.start(300, "reset")
    assert os.path.getsize(tmp_path / "marks") >= 301 * 128
    assert other.read(300)[0] == "reset" and other.episode(300) == "g9-t9"  # remapped
    assert marks.read(0)[0] == "step" and marks.read(1) == []  # what was there stays
    assert [env for env, _ in CallMarks(tmp_path, num_envs=301).running()] == [0, 300]
    marks.close()
    other.close(remove=True)
