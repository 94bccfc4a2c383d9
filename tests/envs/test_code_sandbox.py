"""The Code env's sandbox attacked on purpose: each attack of the hardening issue, refused.

Every attack first switches the audit hook off (``DISABLE_HOOK``: three lines of pure Python,
as the issue describes) and checks that it worked, so what refuses the attack is a kernel layer,
never the hook. Each test names the layers it relies on and skips, printing the reason, where they
are unavailable. Everything is bounded: at most 50 forks, allocations of tens of MiB, sockets and
files only inside the test's own ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_memory.envs.code_exec import CodeEnv, Sandbox, SandboxLimits
from agent_memory.envs.code_exec import sandbox as sandbox_module

TASKS_FILE = Path(sandbox_module.__file__).with_name("tasks.py")
PROJECT = Path(sandbox_module.__file__).resolve().parents[2]

#: Switches the audit hook off for the calling thread (poisons its re-entrancy guard).
DISABLE_HOOK = """
import gc, _thread, json
def _disable_hook():
    for o in gc.get_objects():
        if type(o).__name__ == "function" and o.__name__ == "hook" and o.__closure__:
            for cell in o.__closure__:
                if isinstance(cell.cell_contents, set):
                    cell.cell_contents.add(_thread.get_ident())
                    return True
    return False
assert _disable_hook(), "the audit hook was not found"
import ctypes
ctypes.CDLL(None)  # refused by the hook unless it is off
"""


def run_json(box: Sandbox, code: str) -> dict:
    """Run ``DISABLE_HOOK + code`` (which prints one JSON object last) and return that object."""
    result = box.run(DISABLE_HOOK + code)
    assert result.status == "ok", result.text
    return json.loads(result.text.strip().splitlines()[-1])


def require(box: Sandbox, *names: str) -> None:
    """Skip (printing why) unless every named layer is active."""
    layers = box.layers
    off = {name: layers.get(name, "missing") for name in names}
    off = {k: v for k, v in off.items() if not v.startswith("on")}
    if off:
        print(f"skipped: layers unavailable here: {off}")
        pytest.skip(f"layers unavailable here: {off}")


@pytest.fixture
def box() -> Iterator[Sandbox]:
    with Sandbox(SandboxLimits(timeout_s=20.0)) as b:
        yield b


# --- 1. Unix sockets on the host -----------------------------------------------------------------


class _UnixServer:
    """A Unix socket server in ``directory`` that records every connection it accepts."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "s.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(8)
        self.server.settimeout(0.05)
        self.accepted: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            conn.settimeout(0.5)
            try:
                self.accepted.append(conn.recv(100))
                conn.sendall(b"secret from the host")
            except OSError:
                self.accepted.append(b"")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()


UNIX_ATTACK = """
import socket, os
def attempt(target, kind=socket.SOCK_STREAM):
    try:
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(1)
        s.connect(target)
        s.sendall(b"hello")
        return "connected: " + repr(s.recv(100))
    except OSError as e:
        return f"{type(e).__name__}: {e}"
out = {name: attempt(t) for name, t in TARGETS.items()}
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"hello", TARGETS["direct"])
    out["socketpair dgram sendto"] = "sent"
except OSError as e:
    out["socketpair dgram sendto"] = f"{type(e).__name__}: {e}"
for family in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_RAW if family == "AF_PACKET" else socket.SOCK_DGRAM)
        out[family] = "created"
    except OSError as e:
        out[family] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("kwargs", "layers"),
    [
        ({}, ("seccomp", "filesystem")),
        ({"private_fs": False}, ("seccomp",)),
        ({"seccomp": False}, ("filesystem",)),
    ],
    ids=["all-layers", "seccomp-only", "private-fs-only"],
)
def test_host_unix_sockets_are_unreachable(tmp_path: Path, kwargs: dict, layers: tuple) -> None:
    server = _UnixServer(tmp_path)
    link = tmp_path / "link.sock"
    link.symlink_to(server.path)
    try:
        with Sandbox(SandboxLimits(timeout_s=20.0), **kwargs) as box:
            require(box, *layers)
            Path(box.workdir, "in_workdir.sock").symlink_to(server.path)
            targets = {
                "direct": server.path,
                "symlink": str(link),
                "symlink in the working dir": "in_workdir.sock",
                "via /proc/self/root": "/proc/self/root" + server.path,
            }
            out = run_json(box, f"TARGETS = {targets!r}\n{UNIX_ATTACK}")
    finally:
        server.close()
    assert server.accepted == [], out
    for name, outcome in out.items():
        assert not outcome.startswith(("connected", "sent")), (name, out)
    if "seccomp" in layers:  # the kernel refuses the socket itself
        for name in (
            "direct",
            "symlink",
            "socketpair dgram sendto",
            "AF_INET",
            "AF_INET6",
            "AF_NETLINK",
            "AF_PACKET",
        ):
            assert "Operation not permitted" in out[name], (name, out)
    else:  # the private view: the paths do not exist
        for name in ("direct", "symlink", "symlink in the working dir", "via /proc/self/root"):
            assert out[name].startswith("FileNotFoundError"), (name, out)


def test_socketpair_stream_still_works_for_asyncio(box: Sandbox) -> None:
    result = box.run("import asyncio\nasync def f():\n    return 6 * 7\nasyncio.run(f())")
    assert result.text == "42\n", result.text


# --- 2. the audit hook switched off --------------------------------------------------------------

PROCESS_ATTACK = """
import os, subprocess, ctypes
out = {}
def attempt(name, fn):
    try:
        out[name] = "worked: " + repr(fn())
    except BaseException as e:
        out[name] = f"{type(e).__name__}: {e}"
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
attempt("os.fork", fork)
attempt("subprocess", lambda: subprocess.run(["/bin/true"]).returncode)
rc = os.system("true")  # the C library reports a failed fork as the shell's 127
out["os.system"] = "worked" if rc == 0 else f"failed: exit status {rc}"
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    rc = getattr(libc, name)(*args)
    return "worked" if rc >= 0 else "refused: " + os.strerror(ctypes.get_errno())
out["unshare(CLONE_NEWUSER)"] = call("unshare", 0x10000000)
out["ptrace(PTRACE_ATTACH, parent)"] = call("ptrace", 16, os.getppid(), None, None)
out["mount tmpfs"] = call("mount", b"none", b".", b"tmpfs", 0, None)
out["setuid(0)"] = call("setuid", 0)
out["prctl(PR_SET_PDEATHSIG, 0)"] = call("prctl", 1, 0, 0, 0, 0)  # outliving the supervisor
sig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)
out["pdeathsig"] = sig.value
out["setsid"] = call("setsid")  # leaving the process group
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
for key in ("Uid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
    out[key] = status[key].split()
print(json.dumps(out))
"""


def test_disabled_audit_hook_leaves_no_processes_and_no_privileges(box: Sandbox) -> None:
    require(box, "seccomp", "privileges")
    out = run_json(box, PROCESS_ATTACK)
    for name in ("os.fork", "subprocess", "os.system"):
        assert not out[name].startswith("worked"), (name, out)
    for name in ("unshare(CLONE_NEWUSER)", "ptrace(PTRACE_ATTACH, parent)", "mount tmpfs"):
        assert out[name] == "refused: Operation not permitted", (name, out)
    assert out["setuid(0)"].startswith("refused"), out
    assert out["pdeathsig"] == 9, out  # SIGKILL when the supervisor dies (set after the uid drop)
    assert out["prctl(PR_SET_PDEATHSIG, 0)"] == out["setsid"] == "refused: Operation not permitted"
    assert int(out["CapEff"][0], 16) == int(out["CapPrm"][0], 16) == 0, out
    assert int(out["CapBnd"][0], 16) == 0, out
    assert out["NoNewPrivs"] == ["1"] and out["Seccomp"][0] == "2", out
    if os.geteuid() == 0:
        assert "0" not in out["Uid"], out  # real, effective, saved and fs uid all dropped


FORK_EXEC = """
import json, subprocess, sys
sys.audit = lambda *args: None  # subprocess raises its event through sys.audit: now it does not
subprocess._USE_POSIX_SPAWN = False  # straight to _posixsubprocess.fork_exec
try:
    p = subprocess.Popen(["/bin/sh", "-c", "echo escaped"], stdout=subprocess.PIPE)
    r = "worked: " + p.communicate()[0].decode().strip()
except OSError as e:
    r = f"{type(e).__name__}: {e}"
print(json.dumps({"fork_exec": r}))
"""


@pytest.mark.parametrize("seccomp", [True, False], ids=["seccomp", "without-seccomp"])
def test_fork_exec_skips_the_hook_but_not_seccomp(seccomp: bool) -> None:
    """With the hook on: ``_posixsubprocess.fork_exec`` raises no audit event of its own."""
    with Sandbox(SandboxLimits(timeout_s=20.0), seccomp=seccomp) as box:
        if seccomp:
            require(box, "seccomp")
        result = box.run(FORK_EXEC)
    out = json.loads(result.text.strip().splitlines()[-1])
    if seccomp:
        assert out["fork_exec"] == "PermissionError: [Errno 1] Operation not permitted", out
    else:  # the bypass is real: only seccomp stands in its way
        assert out["fork_exec"] == "worked: escaped", out


# --- 3. memory and processes bounded in total ----------------------------------------------------

FORK_ATTACK = """
import os
r, w = os.pipe()
pids, errors = [], set()
for _ in range(50):
    try:
        pid = os.fork()
    except OSError as e:
        errors.add(f"{type(e).__name__}: {e}")
        continue
    if pid == 0:  # alive until killed, however slowly the others fork (EOF: the parent is gone)
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps({"forked": len(pids), "errors": sorted(errors)}))
"""

THREAD_ATTACK = """
import threading, time
started, stop = [], threading.Event()
try:
    for _ in range(50):
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        started.append(t)
    error = ""
except RuntimeError as e:
    error = str(e)
stop.set()
print(json.dumps({"threads": len(started), "error": error}))
"""


def test_fifty_forks_are_refused(box: Sandbox) -> None:
    require(box, "seccomp")
    out = run_json(box, FORK_ATTACK)
    assert out == {"forked": 0, "errors": ["PermissionError: [Errno 1] Operation not permitted"]}


def test_threads_work_but_are_capped() -> None:
    with Sandbox(SandboxLimits(timeout_s=20.0, processes=12)) as box:
        assert (
            box.run(
                "import threading\nt = threading.Thread(target=print, args=('hi',))\n"
                "t.start(); t.join()"
            ).text
            == "hi\n"
        )
        require(box, "cgroup")
        out = run_json(box, THREAD_ATTACK)
    assert 0 < out["threads"] < 12 and "can't start new thread" in out["error"], out


def test_without_seccomp_forks_are_capped_in_total() -> None:
    """The cgroup (or RLIMIT_NPROC) bounds the process count even where forking is allowed."""
    with Sandbox(SandboxLimits(timeout_s=20.0, processes=8), seccomp=False) as box:
        layers = box.layers
        if not (layers["cgroup"].startswith("on") or layers["privileges"].startswith("on")):
            require(box, "cgroup")
        out = run_json(box, FORK_ATTACK)
    assert out["forked"] < 8 and out["errors"], out  # the supervisor and the runner count too


MEMORY_ATTACK = """
import os, select
r, w = os.pipe()  # children -> parent: their index once they hold 40 MiB, again when asked
go_r, go_w = os.pipe()  # parent -> children: closed (EOF) = "still holding? say so and exit"
pids = []
for index in range(6):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(go_w)
        try:
            block = bytearray(40 * 2**20)
            for i in range(0, len(block), 4096):
                block[i] = 1  # touch every page: resident, not just reserved
            os.write(w, bytes([index]))
            os.read(go_r, 1)  # hold it until the parent has heard from every child
            os.write(w, bytes([index]))
        finally:
            os._exit(0)
    pids.append(pid)
os.close(w)
os.close(go_r)
# Every child either says it holds its 40 MiB or ends (the OOM killer may take it, before or
# after it said so): polled on what happened, no deadline (the run's timeout bounds it).
reported, ended = set(), set()
while len(reported | ended) < len(pids):
    ended |= {i for i, p in enumerate(pids) if i not in ended and os.waitpid(p, os.WNOHANG)[0]}
    if select.select([r], [], [], 0.05)[0]:
        reported |= set(os.read(r, 16))
# The children alive now all hold their 40 MiB at this moment: those that answer this.
os.close(go_w)
holding = set()
while chunk := os.read(r, 16):  # EOF once every child has exited
    holding |= set(chunk)
for i in set(range(len(pids))) - ended:
    os.waitpid(pids[i], 0)
print(json.dumps({"children holding 40 MiB": len(holding)}))
"""


def test_without_seccomp_memory_is_bounded_in_total() -> None:
    """6 children x 40 MiB (each within its own 96 MiB RLIMIT_AS): the cgroup holds the total."""
    with Sandbox(SandboxLimits(timeout_s=20.0, memory_mb=96), seccomp=False) as box:
        require(box, "cgroup")
        if "memory" not in box.layers["cgroup"]:
            pytest.skip(f"no memory cgroup here: {box.layers['cgroup']}")
        result = box.run(DISABLE_HOOK + MEMORY_ATTACK)
    total = 96 + sandbox_module.CGROUP_HEADROOM_MB
    if result.status == "ok":
        held = json.loads(result.text.strip().splitlines()[-1])["children holding 40 MiB"]
        # 6 x 40 MiB without it; at least one fits (else the attack allocated nothing)
        assert 1 <= held < 6 and held * 40 <= total, result.text
    else:  # the OOM killer took the runner itself: also within the limit
        assert result.status == "died", result.text


# --- 4. forged result frames ---------------------------------------------------------------------

FORGE = """
import json, os, stat
frame = json.dumps(FRAME).encode()
frame = len(frame).to_bytes(4, "big") + frame if RAW is None else RAW
written = []
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, frame)
            written.append(fd)
    except OSError:
        pass
try:
    os.write(int(sys.argv[2]), frame)
    written.append("argv[2]")
except (IndexError, ValueError, OSError):
    pass
print(json.dumps({"written": written}))
"""


def _forge(frame: str, raw: bytes | None = None) -> str:
    """Code that writes a frame (``frame`` is a Python expression) to every pipe it holds."""
    return f"import sys\nFRAME = {frame}\nRAW = {raw!r}\n{FORGE}"


FAKE = {
    "op": "result",
    "seq": 2,
    "status": "ok",
    "head": "FORGED\n",
    "tail": "",
    "omitted": 0,
    "names": [["forged", "int"]],
}
#: Finds the sequence number of the current run in the runner's frames (if it has one).
FIND_SEQ = """
f = sys._getframe()
while f is not None and "seq" not in f.f_locals:
    f = f.f_back
SEQ = f.f_locals["seq"] if f is not None else None
"""


def test_forged_frames_cannot_shift_later_observations() -> None:
    env = CodeEnv(timeout_s=20.0)
    env.reset(seed=0)
    forged_current = "import sys\n" + FIND_SEQ + _forge(f"{{**{FAKE!r}, 'seq': SEQ}}")
    hostile = _forge(repr({**FAKE, "omitted": "many", "names": "x"}))
    for code in (_forge(repr(FAKE)), forged_current, hostile):
        obs, _, _, _, info = env.step(f"<code>{code}</code>")
        assert info["sandbox_status"] in ("ok", "died"), obs
        for word in ("two", "three"):
            obs, _, _, _, info = env.step(f"<code>print('{word}')</code>")
            assert obs == f"{word}\n", obs  # never one step behind
            assert "forged" not in {name for name, _ in env.sandbox.run("pass").names}
    env.close()


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xff\xff\xff", b"\x00\x00\x00\x05[1,2]", b'\x00\x00\x00\x02{"', b"garbage, not a frame"],
)
def test_malformed_frames_end_the_run_as_a_result(raw: bytes) -> None:
    env = CodeEnv(timeout_s=5.0)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(f"<code>{_forge('None', raw)}</code>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["sandbox_status"] in ("ok", "died", "timeout"), obs
    obs, *_ = env.step("<code>print('next')</code>")
    assert obs == "next\n"
    env.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"omitted": "many"},
        {"names": [["a"]]},
        {"names": "x"},
        {"head": 5},
        {"status": ["ok"]},
        {"omitted": -3},
        {"seq": "1"},
    ],
)
def test_hostile_result_fields_never_raise(fields: dict) -> None:
    """The parent's own parsing of a frame (what a compromised supervisor could send)."""
    msg = {
        "op": "result",
        "seq": 1,
        "status": "ok",
        "head": "h",
        "tail": "",
        "omitted": 0,
        "names": [["a", "int"]],
        **fields,
    }
    result = sandbox_module.parse_result(msg, seq=1, cap=100)
    assert result is None or result.status in ("ok", "error")


THREAD_FORGE = """
import json, os, stat, sys, threading, time
frame = json.dumps(FRAME).encode()
frame = len(frame).to_bytes(4, "big") + frame
first, forged = sys.stdout, threading.Event()
def forge():  # once the next step runs (it has a capture of its own), forge its answer
    while sys.stdout is first or not hasattr(sys.stdout, "result"):
        time.sleep(0.001)
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISFIFO(os.fstat(int(name)).st_mode):
                os.write(int(name), frame)
        except OSError:
            pass
    forged.set()
threading.Thread(target=forge, daemon=True).start()
"""
#: The next step waits until the thread has forged its answer (if the thread is still there).
AFTER_FORGE = "try:\n    forged.wait()\nexcept NameError:\n    pass\nprint('real')"


def test_a_thread_left_running_cannot_answer_for_the_next_step() -> None:
    env = CodeEnv(timeout_s=20.0)
    env.reset(seed=0)
    code = "import threading\nt = threading.Thread(target=print, args=('joined',))\nt.start(); t.join()"
    obs, *_ = env.step(f"<code>{code}</code>")
    assert obs == "joined\n" and env.sandbox.restarts == 0, obs  # threads that end are fine
    left, _, _, _, info = env.step(f"<code>FRAME = {{**{FAKE!r}, 'seq': 3}}\n{THREAD_FORGE}</code>")
    for code, expected in ((AFTER_FORGE, "real\n"), ("print('four')", "four\n")):
        obs, *_ = env.step(f"<code>{code}</code>")
        assert obs == expected, obs  # not FORGED: the thread died with a restart
    assert info["sandbox_status"] == "ok" and "Threads the code started were still" in left, left
    assert env.sandbox.restarts == 1
    env.close()


#: Helpers (after ``FIND_SEQ``) for run N to write frames to every pipe the runner holds.
NEXT_FRAME = """
import json, os, stat, threading, time
def frame(seq, head):
    body = json.dumps({"op": "result", "seq": seq, "status": "ok", "head": head, "tail": "",
                       "omitted": 0, "names": [["forged", "int"]]}).encode()
    return len(body).to_bytes(4, "big") + body
def write(data):
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISFIFO(os.fstat(int(name)).st_mode):
                os.write(int(name), data)
        except OSError:
            pass
"""
#: The main thread: a frame for its own run (which ends the wait for it), then one for the next.
NEXT_FROM_MAIN = "write(frame(SEQ, 'mine\\n') + frame(SEQ + 1, 'FORGED\\n'))"
#: A thread that waits until the runner waits for the next run (this run's answer is in the pipe),
#: writes a frame for the next run and a partial header, and ends: no thread is left running.
NEXT_FROM_THREAD = """
main = threading.main_thread().ident
def forge():
    while sys._current_frames()[main].f_code.co_name != "_read_exact":
        time.sleep(0.001)
    write(frame(SEQ + 1, "FORGED\\n") + b"\\x00\\x00\\x10")
threading.Thread(target=forge).start()
"""


@pytest.mark.parametrize("code", [NEXT_FROM_MAIN, NEXT_FROM_THREAD], ids=["main", "thread"])
def test_frames_a_step_leaves_cannot_answer_for_the_next_step(code: str) -> None:
    """What step N wrote to the result channel, however timed, is never step N + 1's answer."""
    env = CodeEnv(timeout_s=20.0)
    env.reset(seed=0)
    env.step("<code>x = 1</code>")
    env.step(f"<code>import sys\n{FIND_SEQ}{NEXT_FRAME}{code}</code>")
    for step, expected in (("print('real')", "real\n"), ("print('four')", "four\n")):
        obs, *_ = env.step(f"<code>{step}</code>")
        assert obs == expected, obs  # not FORGED, nor a death from the partial frame
    assert "forged" not in {name for name, _ in env.sandbox.run("pass").names}
    env.close()


# --- 5. the answers ------------------------------------------------------------------------------

ANSWER_ATTACK = """
import os, sys
out = {}
def attempt(name, fn):
    try:
        out[name] = "read: " + repr(fn()[:40])
    except BaseException as e:
        out[name] = f"{type(e).__name__}: {e}"
attempt("open", lambda: open(TASKS).read())
attempt("proc root", lambda: open("/proc/self/root" + TASKS).read())
attempt("relative from cwd", lambda: open(os.path.relpath(TASKS)).read())
attempt("/proc/self/cwd", lambda: open("/proc/self/cwd/" + os.path.relpath(TASKS)).read())
def via_link():
    os.symlink(TASKS, "tasks_link.py")
    return open("tasks_link.py").read()
attempt("symlink", via_link)
def imported():
    sys.path.insert(0, PROJECT)
    import agent_memory.envs.code_exec.tasks as t
    return repr([task.answer for task in t.TASKS])
attempt("import", imported)
attempt("listdir project", lambda: repr(os.listdir(PROJECT)))
attempt("api dir", lambda: repr(os.listdir(os.path.dirname(api.__file__))))
attempt("test tmp dir", lambda: open(SECRET).read())
attempt("tmp listing", lambda: repr(os.listdir("/tmp")))
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("kwargs", "layer"),
    [({}, "filesystem"), ({"private_fs": False}, "landlock"), ({"landlock": False}, "filesystem")],
    ids=["all-layers", "landlock-only", "private-fs-only"],
)
def test_task_answers_and_host_files_are_unreadable(
    tmp_path: Path, kwargs: dict, layer: str
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    code = f"TASKS = {str(TASKS_FILE)!r}\nPROJECT = {str(PROJECT)!r}\nSECRET = {str(secret)!r}\n"
    with Sandbox(SandboxLimits(timeout_s=20.0), **kwargs) as box:
        require(box, layer)
        out = run_json(box, code + ANSWER_ATTACK)
    for name, outcome in out.items():
        if name == "tmp listing":
            assert tmp_path.parts[2] not in outcome, out  # /tmp/<the test's dir> is not there
            continue
        assert not outcome.startswith("read"), (name, out)
    text = json.dumps(out)
    assert "TASKS" not in text.replace('"', "") or "Error" in text


def test_honest_code_still_has_the_standard_library(box: Sandbox) -> None:
    code = (
        "import statistics, json, re, datetime, collections, decimal, fractions, itertools\n"
        "import zoneinfo, csv, sqlite3, tempfile, pathlib\n"
        "db = sqlite3.connect(':memory:'); db.execute('create table t (x)')\n"
        "pathlib.Path(tempfile.mkstemp()[1]).write_text('ok')\n"
        "print(statistics.mean([1, 2, 3]), os.cpu_count() > 0, len(api.list_cities()))"
    )
    result = box.run("import os\n" + code)
    assert result.text == "2 True 8\n", result.text


# --- 6. the working dir: depth and size --------------------------------------------------------

NESTED = """
import os
top = os.getcwd()
for _ in range(3000):  # deeper than Python's recursion limit, a path longer than PATH_MAX
    os.mkdir("d")
    os.chdir("d")
open("leaf.txt", "w").write("x")
os.mkdir("shut")
os.chmod("shut", 0)
os.chmod(".", 0o500)
os.chdir(top)
print(json.dumps({"made": 3000}))
"""


def test_deeply_nested_dirs_are_removed_at_reset() -> None:
    env = CodeEnv(timeout_s=20.0)
    env.reset(seed=0)
    workdir = env.sandbox.workdir
    assert run_json(env.sandbox, NESTED) == {"made": 3000}
    env.reset(seed=0)  # removes the old working dir
    assert not os.path.exists(workdir)
    assert env.step("<code>print('fresh')</code>")[0] == "fresh\n"
    env.close()


def test_removal_follows_no_link_and_stops_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_memory.envs.code_exec.sandbox_child import files

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "link").symlink_to(outside)
    (tree / "top_link").symlink_to(outside / "keep.txt")
    files.remove_tree(str(tree))
    assert not tree.exists() and (outside / "keep.txt").read_text() == "keep"
    (tree / "a").mkdir(parents=True)
    (tree / "f").write_text("x")
    monkeypatch.setattr(files, "MAX_ENTRIES", 1)
    with pytest.raises(
        OSError,
        match=re.escape(f"removing {tree}: [Errno 27] more than 1 entries: stopped (remove"),
    ):
        files.remove_tree(str(tree))


DISK_ATTACKS = {
    "big files": "for i in range(12):\n    open(f'big{i}', 'wb').write(bytes(2**20))",
    "many empty files": "for i in range(3000):\n    open(f'e{i}', 'w').close()",
    "while it runs": "import threading\nfor i in range(12):\n    open(f'big{i}', 'wb').write("
    "bytes(2**20))\nthreading.Event().wait()",
}


@pytest.mark.parametrize("attack", DISK_ATTACKS)
def test_the_disk_quota_ends_the_episode(attack: str) -> None:
    """12 MiB (or 3000 entries, counted 4 KiB each) against a quota of 8 MiB."""
    env = CodeEnv(timeout_s=600.0, max_disk_mb=8, max_file_size_mb=4)
    env.reset(seed=0)
    workdir = env.sandbox.workdir
    assert env.sandbox.layers["disk"].startswith("on (")
    obs, reward, terminated, truncated, info = env.step("<code>open('ok', 'w').write('x')</code>")
    assert (info["sandbox_status"], terminated) == ("ok", False), obs
    obs, reward, terminated, truncated, info = env.step(f"<code>{DISK_ATTACKS[attack]}</code>")
    assert (reward, terminated, truncated, info["sandbox_status"]) == (0.0, True, False, "quota")
    assert "held more than the disk quota of 8 MiB" in obs, obs
    if attack == "while it runs":  # never reaches its end: measured while it runs
        assert "while the code ran" in obs, obs
    assert env.sandbox.closed and not os.path.exists(workdir)  # the files are gone at once
    obs, _, terminated, _, info = env.step("<code>print(1)</code>")
    assert terminated and not info["is_action_valid"], obs
    assert "the episode is over (the disk quota was exceeded)" in obs
    env.close()


# --- the layers themselves -----------------------------------------------------------------------


#: Every layer a sandbox reports (the module docstring of agent_memory.envs.code_exec.sandbox describes each).
LAYERS = (
    "network",
    "filesystem",
    "rlimits",
    "privileges",
    "landlock",
    "seccomp",
    "audit_hook",
    "protocol",
    "cgroup",
    "disk",
)


def _in_ci() -> bool:
    """``CI`` is set (``CI=true``, as CI services set it): the layers must be proven here."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def test_every_layer_is_on_here_as_root(box: Sandbox) -> None:
    """As root every layer is on. In CI (root, every layer available) a layer that is off or
    missing fails, and so does CI not running as root: this test is what keeps the other
    tests' ``require`` skips honest there. Elsewhere (a developer who is not root, a container
    without CAP_SYS_ADMIN, a cgroup v2 hierarchy not delegated) it skips, saying why."""
    ci = _in_ci()
    if os.geteuid() != 0:
        why = "not root: the uid drop and the cgroup need root (a user namespace instead)"
        if ci:
            pytest.fail(f"CI={os.environ['CI']!r} runs the sandbox tests as root, but {why}")
        pytest.skip(why)
    layers = box.layers
    off = {name: layers.get(name, "missing") for name in (*LAYERS, *layers)}
    off = {name: state for name, state in off.items() if not state.startswith("on")}
    if off and not ci:
        print(f"skipped: layers off on this machine: {off}")
        pytest.skip(f"layers off on this machine: {off}")
    assert off == {}, f"layers off or missing in CI (CI={os.environ.get('CI')!r}): {off}"


def test_the_runner_is_confined_as_seen_from_outside(box: Sandbox) -> None:
    """The env process checks the runner's uid, capabilities, seccomp mode and cgroup itself."""
    require(box, "privileges", "seccomp", "cgroup")
    status = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{box.runner_pid}/status").read_text().splitlines()
    )
    if os.geteuid() == 0:
        assert status["Uid"].split() == [str(os.stat(box.workdir).st_uid)] * 4
        assert status["Uid"].split()[0] != "0"
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
    group = box._state["cgroup"]
    assert {box.pid, box.runner_pid} <= group.pids()
    box.close()
    assert not any(os.path.exists(d) for d in group.dirs)  # removed with the sandbox


def test_require_refuses_a_sandbox_without_a_layer() -> None:
    box = Sandbox(seccomp=False, require=("seccomp", "protocol"))
    with pytest.raises(
        RuntimeError,
        match=r"required sandbox layers are not on here: \{'seccomp': 'off \(disabled\)'\}",
    ):
        box.run("1")
    assert box.closed


def test_syscall_numbers_match_libseccomp() -> None:
    """The filter's numbers, x86_64 and aarch64, against libseccomp's own tables."""
    import ctypes

    from agent_memory.envs.code_exec.sandbox_child import seccomp, sysapi

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError as exc:
        print(f"skipped: libseccomp is not installed: {exc}")
        pytest.skip(f"libseccomp is not installed: {exc}")
    resolve = lib.seccomp_syscall_resolve_name_arch
    resolve.argtypes, resolve.restype = (ctypes.c_uint32, ctypes.c_char_p), ctypes.c_int
    arch_tokens = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
    for machine, table in sysapi.SYSCALLS.items():
        for name, number in table.items():
            assert resolve(arch_tokens[machine], name.encode()) == number, (machine, name)
        for name in seccomp.DENIED:  # a name missing from a table must not exist there
            if name not in table:
                assert resolve(arch_tokens[machine], name.encode()) < 0, (machine, name)


UNPRIVILEGED_SCRIPT = """
import json, os
from agent_memory.envs.code_exec import Sandbox, SandboxLimits
with Sandbox(SandboxLimits(timeout_s=20.0, processes=8), seccomp=False) as box:
    out = {"uid": os.getuid(), "layers": box.layers, "run": box.run("6 * 7").text}
    out["forks"] = box.run(DISABLE_HOOK + FORK_ATTACK).text.strip().splitlines()[-1]
with Sandbox(SandboxLimits(timeout_s=20.0)) as box:
    out["seccomp"] = box.layers["seccomp"]
    out["answers"] = box.run(DISABLE_HOOK + CODE + ANSWER_ATTACK).text.strip().splitlines()[-1]
print(json.dumps(out))
"""


def _as_nobody(tmp_path: Path, script: str) -> list[str]:
    """``unshare -m`` + ``setpriv``: ``python -c script`` as uid 65534, in a mount namespace where
    directories that uid cannot traverse (e.g. a pyenv under /root) are opened up by bind mounts."""
    lines, blocked = ["set -e"], {}
    for needed in {sys.base_prefix, sys.prefix, str(PROJECT)}:
        parts = Path(os.path.realpath(needed)).parts
        shut = [i for i in range(2, len(parts)) if not os.stat(Path(*parts[:i])).st_mode & 0o001]
        if len(shut) > 1:
            pytest.skip(f"{needed} is behind more than one directory closed to other users")
        if shut:
            blocked.setdefault(str(Path(*parts[: shut[0]])), set()).add(parts[shut[0]])
    for n, (directory, children) in enumerate(sorted(blocked.items())):
        for child in sorted(children):
            stage = tmp_path / f"stage{n}_{child}"
            stage.mkdir()
            lines.append(f"mount --bind {directory}/{child} {stage}")
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {directory}")
        for child in sorted(children):
            lines.append(f"mkdir -p {directory}/{child}")
            lines.append(f"mount --bind {tmp_path / f'stage{n}_{child}'} {directory}/{child}")
    lines.append(
        f'exec setpriv --reuid=65534 --regid=65534 --clear-groups -- {sys.executable} -c "$SCRIPT"'
    )
    return ["unshare", "-m", "sh", "-c", "\n".join(lines)]


def test_unprivileged_parent_gets_a_user_namespace(tmp_path: Path) -> None:
    """The env run by an ordinary user: a user namespace instead of root's uid drop and cgroup."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("needs root and util-linux's unshare and setpriv to become an ordinary user")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # e.g. a container without CAP_SYS_ADMIN
        print(f"skipped: no mount namespace for the helper: {probe.stderr.strip()}")
        pytest.skip(f"no mount namespace for the helper: {probe.stderr.strip()}")
    code = f"TASKS = {str(TASKS_FILE)!r}\nPROJECT = {str(PROJECT)!r}\nSECRET = '/etc/shadow'\n"
    script = (
        f"DISABLE_HOOK = {DISABLE_HOOK!r}\nFORK_ATTACK = {FORK_ATTACK!r}\n"
        f"ANSWER_ATTACK = {ANSWER_ATTACK!r}\nCODE = {code!r}\n{UNPRIVILEGED_SCRIPT}"
    )
    env = {**os.environ, "SCRIPT": script, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.run(
        _as_nobody(tmp_path, script),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=PROJECT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    layers = out["layers"]
    assert out["uid"] == 65534 and out["run"] == "42\n", out
    if not layers["network"].startswith("on"):
        print(f"skipped: no user namespaces for ordinary users here: {layers['network']}")
        pytest.skip(f"no user namespaces for ordinary users here: {layers['network']}")
    assert "user namespace" in layers["network"] and "user namespace" in layers["filesystem"]
    assert layers["privileges"].startswith("on (uid 65534 (not root), no groups, no capabilities")
    assert "8 tasks for the sandbox's uid" in layers["rlimits"]
    assert layers["cgroup"].startswith("off"), layers  # no delegated cgroup for uid 65534
    forks = json.loads(out["forks"])
    assert forks["forked"] < 8 and forks["errors"], forks  # RLIMIT_NPROC, counted in the userns
    assert out["seccomp"].startswith("on"), out
    for name, outcome in json.loads(out["answers"]).items():
        assert not outcome.startswith("read"), (name, out["answers"])


def test_a_working_dir_swapped_for_a_link_is_never_handed_over(tmp_path: Path) -> None:
    """Code that could rename its working dir (no view, no Landlock) and leave a link to a host
    dir at its path: the next supervisor (root) must not chown, use or remove the link's target."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    before = victim.stat()
    box = Sandbox(SandboxLimits(timeout_s=20.0))
    try:
        box.layers  # noqa: B018  (started)
        old = box.workdir
        os.rename(old, str(tmp_path / "moved"))
        os.symlink(victim, old)
        box.restart()
        assert box.run("import os; os.getcwd()").status == "ok"
        assert box.workdir != old and Path(box.workdir).is_dir()
    finally:
        box.close()
    after = victim.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    assert (victim / "keep.txt").read_text() == "keep"
    assert os.path.islink(old)  # left as it was: the env never follows it
    os.unlink(old)
