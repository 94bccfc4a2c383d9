"""A persistent, resource-limited Python process per episode, behind kernel-enforced layers.

A *supervisor* process (:mod:`~agent_memory.envs.code_exec.sandbox_child`), spoken to over pipes
in JSON frames, forks the *runner* that executes the code; variables persist across runs, like a
Jupyter kernel. After a timeout, crash or limit kill, or a run that leaves threads running, it
restarts empty (files are kept).

Its layers (``protocol``, ``seccomp``, ``privileges``, ``filesystem``, ``network``, ``landlock``,
``cgroup``, ``rlimits``, ``disk``, ``audit_hook``), what each does and what none protects against:
docs/your-own-env.md. :attr:`Sandbox.layers` reports each as ``"on (...)"`` or ``"off (<reason>)"``
(``require=`` refuses to run with one off); with a layer off the others still hold.

Example:
    >>> with Sandbox(SandboxLimits(timeout_s=10.0)) as box:
    ...     _ = box.run("x = 20")
    ...     box.run("x + 22").text
    '42\\n'
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Collection
from pathlib import Path
from typing import Any

from agent_memory.envs.code_exec import cgroup as cgroups
from agent_memory.envs.code_exec.results import (
    CGROUP_HEADROOM_MB,
    RunResult,
    SandboxLimits,
    describe_exit,
    parse_result,
)
from agent_memory.envs.code_exec.sandbox_child import files

CHILD_SCRIPT = str(Path(__file__).parent / "sandbox_child" / "boot.py")
_API_MODULE = str(Path(__file__).with_name("api.py"))
_HEADER = 4
_MAX_FRAME = 16 * 2**20
_BOOT_TIMEOUT_S = 30.0  # generous: a loaded CI machine may start Python slowly
_DISK_CHECK_S = 0.1  # how often a run's working dir is measured while it runs
#: The sandbox's uid is this plus the supervisor's pid (pids are below 2**22).
DEFAULT_UID_BASE = 1_900_000_000


class _Timeout(Exception):
    pass


class _Dead(Exception):
    pass


class _OverQuota(Exception):
    pass


def _kill_group(proc: subprocess.Popen | None, group: cgroups.Cgroup | None) -> int | None:
    """SIGKILL the process group (before reaping the leader, so the id cannot be reused) and
    everything in the cgroup; reap the leader."""
    if proc is None:
        return None
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not take this long
        return None


def _close_fds(state: dict) -> None:
    """Close the pipe ends kept in ``state``."""
    for key in ("cmd_fd", "resp_fd"):
        fd = state.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _cleanup(state: dict) -> None:
    """Finalizer shared by close() and garbage collection: kill, close fds, remove the dir."""
    if state.get("owner") != os.getpid():
        return  # a forked copy (e.g. a vector-env worker) must not kill its parent's sandbox
    group = state.pop("cgroup", None)
    _kill_group(state.pop("proc", None), group)
    if group is not None:
        group.remove()
    _close_fds(state)
    workdir = state.pop("workdir", None)
    if workdir:
        files.remove_tree(workdir)


class Sandbox:
    """One sandboxed Python process with a persistent namespace and an isolated working dir.

    It starts in the constructor (the first :meth:`run` waits for it); ``close()`` kills it and
    removes the working dir and the cgroup. Leave the layer switches on (they exist for tests).

    Args:
        limits: resource limits (see :class:`SandboxLimits`).
        landlock, isolate_network, seccomp, drop_privileges, cgroup, private_fs: turn each layer
            on where the kernel allows it.
        preload: module name -> source file loaded before lock-down (default: the shop ``api``).
        uid_base: the sandbox's uid is ``uid_base`` + the supervisor's pid (root only).
        require: layers that must be on, else the first :meth:`run` raises ``RuntimeError``.

    Attributes:
        boot_seconds: spawn-to-ready time of the current process.
        runs: :meth:`run` calls so far.
        restarts: processes replaced so far.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        landlock: bool = True,
        isolate_network: bool = True,
        seccomp: bool = True,
        drop_privileges: bool = True,
        cgroup: bool = True,
        private_fs: bool = True,
        preload: dict[str, str] | None = None,
        uid_base: int = DEFAULT_UID_BASE,
        require: Collection[str] = (),
    ) -> None:
        self.limits = limits or SandboxLimits()
        self._switches = {
            "landlock": landlock,
            "isolate_network": isolate_network,
            "seccomp": seccomp,
            "drop_privileges": drop_privileges,
            "private_fs": private_fs,
        }
        self._preload = {"api": _API_MODULE} if preload is None else dict(preload)
        self._uid_base = uid_base
        self._require = tuple(require)
        self._workdir = tempfile.mkdtemp(prefix="code_env_")
        self._workdir_id = _identity(self._workdir)
        self._state: dict[str, Any] = {"workdir": self._workdir, "owner": os.getpid()}
        self._finalizer = weakref.finalize(self, _cleanup, self._state)
        if cgroup:
            total = (self.limits.memory_mb + CGROUP_HEADROOM_MB) * 2**20
            group, self._cgroup_layer = cgroups.create(total, self.limits.processes)
            self._state["cgroup"] = group
        else:
            self._cgroup_layer = "off (disabled)"
        self._ready = False
        self._layers: dict[str, str] = {}
        self._seq = 0
        self.runner_pid: int | None = None  # the process running the code, once ready
        self.boot_seconds = 0.0
        self.restarts = self.runs = 0
        self._spawn()

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def workdir(self) -> str:
        """The process's working dir (also its ``HOME`` and ``TMPDIR``)."""
        return self._workdir

    @property
    def pid(self) -> int | None:
        """The supervisor's process id (None after close)."""
        proc = self._state.get("proc")
        return None if proc is None else proc.pid

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def layers(self) -> dict[str, str]:
        """Each protection layer's state, ``"on (...)"`` or ``"off (<reason>)"`` (waits for it)."""
        self._wait_ready()
        return dict(self._layers)

    def _check_workdir(self) -> None:
        """Make sure the working dir is still the directory we made (before root hands it over).

        Without the private view and Landlock, code could swap it for a link to, say, ``/etc``
        for the next supervisor (root) to chown; then the sandbox gets a fresh dir.
        """
        if _identity(self._workdir) != self._workdir_id:
            self._workdir = tempfile.mkdtemp(prefix="code_env_")
            self._workdir_id = _identity(self._workdir)
            self._state["workdir"] = self._workdir

    def _spawn(self) -> None:
        self._check_workdir()
        cmd_r, cmd_w = os.pipe()
        resp_r, resp_w = os.pipe()
        workdir = self.workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}
        env["LANG"] = "C.UTF-8"
        self._t_spawn = time.monotonic()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", CHILD_SCRIPT, str(cmd_r), str(resp_w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=workdir,
                env=env,
                pass_fds=(cmd_r, resp_w),
                start_new_session=True,
            )
        finally:
            os.close(cmd_r)
            os.close(resp_w)
        self._state.update(proc=proc, cmd_fd=cmd_w, resp_fd=resp_r)
        self._ready = False
        self._seq = 0
        group = self._state.get("cgroup")
        if group is not None:  # before it gets its init frame: nothing has started yet
            try:
                group.add(proc.pid)
            except OSError as exc:
                self._cgroup_layer = f"off (joining {group.dirs}: {exc.strerror or exc})"
        limits = dataclasses.asdict(self.limits)
        init = {
            "op": "init",
            "workdir": workdir,
            "workdir_id": list(self._workdir_id),
            "parent_pid": os.getpid(),
            **self._switches,
            "uid_base": self._uid_base,
            "preload": self._preload,
            "cap": limits.pop("output_chars"),
            "limits": limits,
        }
        with contextlib.suppress(_Dead, _Timeout):  # a dead child shows up at the next read
            self._send(init, time.monotonic() + _BOOT_TIMEOUT_S)

    def _kill(self) -> int | None:
        code = _kill_group(self._state.pop("proc", None), self._state.get("cgroup"))
        _close_fds(self._state)
        return code

    def _exited_by_itself(self) -> bool:
        proc = self._state.get("proc")
        return proc is None or proc.returncode is not None or _peek_exited(proc.pid, 1.0)

    def restart(self) -> None:
        """Kill the process and start a fresh one (same working dir, empty namespace)."""
        self._check_open()
        self._kill()
        self.restarts += 1
        self._spawn()

    def close(self) -> None:
        """Kill the processes, reap them, remove the working dir and the cgroup. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the sandbox is closed")

    # --- framing ---------------------------------------------------------------------------------

    def _send(self, obj: dict, deadline: float) -> None:
        data = memoryview(self._frame(obj))
        fd = self._state["cmd_fd"]
        os.set_blocking(fd, False)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout
            events = poller.poll(remaining * 1000)
            if not events:
                continue
            if events[0][1] & (select.POLLERR | select.POLLHUP):
                raise _Dead
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                continue
            except BrokenPipeError as exc:
                raise _Dead from exc

    @staticmethod
    def _frame(obj: dict) -> bytes:
        body = json.dumps(obj).encode("utf-8")
        return len(body).to_bytes(_HEADER, "big") + body

    def _recv(self, deadline: float, watch_disk: bool = False) -> dict:
        fd = self._state["resp_fd"]
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        buf = bytearray()
        size: int | None = None
        while True:
            if size is None and len(buf) >= _HEADER:
                size = int.from_bytes(buf[:_HEADER], "big")
                if size > _MAX_FRAME:
                    raise _Dead("a malformed frame came from the sandbox")
            if size is not None and len(buf) >= _HEADER + size:
                try:
                    msg = json.loads(bytes(buf[_HEADER : _HEADER + size]))
                except ValueError as exc:
                    raise _Dead("a malformed frame came from the sandbox") from exc
                if not isinstance(msg, dict):
                    raise _Dead("a malformed frame came from the sandbox")
                return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout
            if not poller.poll((min(remaining, _DISK_CHECK_S) if watch_disk else remaining) * 1000):
                if watch_disk and (why := self._over_quota(strict=False)):
                    raise _OverQuota(why)
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Dead
            buf += chunk

    def _wait_ready(self) -> None:
        self._check_open()
        if self._ready:
            return
        try:
            msg = self._recv(time.monotonic() + _BOOT_TIMEOUT_S)
        except (_Dead, _Timeout) as exc:
            code = self._kill()
            raise RuntimeError(
                f"the sandbox process failed to start (exit code {code}): {exc or 'no answer'}"
            ) from None
        layers = msg.get("layers")
        if msg.get("op") != "ready" or not isinstance(layers, dict):
            self._kill()
            why = msg.get("why", "") if msg.get("op") == "failed" else ""
            raise RuntimeError(
                f"the sandbox process sent {msg.get('op')!r} instead of 'ready'"
                + (f": {why}" if why else "")
            )
        self._layers = {str(k): str(v) for k, v in layers.items()}
        self._layers["cgroup"] = self._cgroup_layer
        self._layers["disk"] = (
            f"on (the working dir's total, each entry counted as at least 4 KiB, measured after "
            f"each run and every {_DISK_CHECK_S:g} s during one: over {self.limits.disk_mb} MiB "
            "the sandbox closes, removing its files; not a file-system quota: a run can write "
            "past it until the next measure)"
        )
        runner = msg.get("runner_pid")
        self.runner_pid = runner if isinstance(runner, int) else None
        self.boot_seconds = time.monotonic() - self._t_spawn
        self._ready = True
        off = {k: self._layers.get(k, "missing") for k in self._require}
        off = {k: v for k, v in off.items() if not v.startswith("on")}
        if off:
            self.close()
            raise RuntimeError(f"required sandbox layers are not on here: {off}")

    # --- running code ----------------------------------------------------------------------------

    def run(self, code: str) -> RunResult:
        """Run ``code`` in the persistent namespace; never raises for anything the code does.

        A timeout or the death of the process is reported in the result, and the process is
        restarted at once.
        """
        self._check_open()
        self._wait_ready()
        self.runs += 1
        self._seq += 1
        deadline = time.monotonic() + self.limits.timeout_s
        try:
            self._send({"op": "exec", "seq": self._seq, "code": code}, deadline)
            while True:
                msg = self._recv(deadline, watch_disk=True)
                if msg.get("op") == "died":
                    raise _Dead(self._death_reason(msg))
                result = parse_result(msg, self._seq, self.limits.output_chars)
                if result is not None and msg.get("restart") is not None:
                    result = self._restart_for_threads(result)
                if result is not None:
                    return self._within_quota(result)
                if msg.get("op") != "result":
                    raise _Dead("an unexpected frame came from the sandbox")
        except _OverQuota as exc:
            return self._end(f"{exc} while the code ran")
        except _Timeout:
            self.restart()
            note = (
                f"Timeout: the code ran longer than {self.limits.timeout_s:g} s; the sandbox "
                "process was killed and restarted. All variables and imports are lost (files in "
                "the working directory are kept; `api` is loaded again). Output printed before "
                "the timeout is lost."
            )
            return self._within_quota(RunResult(status="timeout", restarted=True, note=note))
        except _Dead as exc:
            exited = self._exited_by_itself()
            code_ = self._kill()
            self.restarts += 1
            self._spawn()
            if str(exc):
                why = str(exc)
            elif exited:
                why = describe_exit(code_, self.limits)
            else:
                why = "it closed its connection to the env and was killed"
            note = (
                f"The sandbox process died: {why}. It was restarted: all variables and imports "
                "are lost (files in the working directory are kept; `api` is loaded again)."
            )
            return self._within_quota(RunResult(status="died", restarted=True, note=note))

    def _restart_for_threads(self, result: RunResult) -> RunResult:
        """The supervisor killed the runner, which had threads left: they could otherwise answer
        for a later run."""
        self.restart()
        note = (
            "Threads the code started were still running at the end of the step, so the sandbox "
            "process was restarted (a step's threads must end within it). All variables and "
            "imports are lost (files in the working directory are kept; `api` is loaded again)."
        )
        return dataclasses.replace(result, restarted=True, note=note)

    def _over_quota(self, strict: bool) -> str:
        """Why the working dir is over the disk quota ("" if it is not). Not ``strict`` (while a
        run changes the tree), a walk that met a change is no verdict; after the run it is one."""
        limit = self.limits.disk_mb * 2**20
        try:
            if files.usage(self._workdir, limit) <= limit:
                return ""
        except OSError as exc:
            return f"its working dir could not be measured ({exc})" if strict else ""
        return f"its working dir held more than the disk quota of {self.limits.disk_mb} MiB"

    def _within_quota(self, result: RunResult) -> RunResult:
        why = self._over_quota(strict=True)
        return self._end(why) if why else result

    def _end(self, why: str) -> RunResult:
        """Close the sandbox (which removes the files) for going over the disk quota."""
        self.close()
        note = f"The sandbox was closed and its files removed: {why}. The episode is over."
        return RunResult(status="quota", note=note)

    def _death_reason(self, msg: dict) -> str:
        """Why the runner died, from the supervisor's "died" frame."""
        code, why = msg.get("code"), msg.get("why")
        if isinstance(why, str) and why:
            return why[:500]
        if isinstance(code, int) and not isinstance(code, bool):
            return describe_exit(code, self.limits)
        return "it died"


def _identity(path: str) -> tuple[int, int]:
    """``(device, inode)`` of ``path`` itself (a link is not followed); (-1, -1) if it is gone
    or not a directory."""
    try:
        st = os.lstat(path)
    except OSError:
        return -1, -1
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else (-1, -1)


def _peek_exited(pid: int, wait_s: float) -> bool:
    """Whether ``pid`` (our child) has exited, waiting up to ``wait_s``, without reaping it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
