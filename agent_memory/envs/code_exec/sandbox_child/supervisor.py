"""The supervisor: owns the env's pipes, builds the sandbox, forks the runner, relays answers.

On ``init`` it preloads the modules, enters the namespaces, builds the view, forks the runner,
hardens itself and answers ``ready`` (or ``failed``). Only a well-formed result of each ``exec``
comes back (:func:`.protocol.clean_result`); if the runner dies or breaks the framing, the answer
is ``died`` and the supervisor exits, as it does (after emptying the working dir) if the env dies.
If a run leaves threads running, the runner is killed before its answer goes back (marked
``restart``) and the supervisor exits: no thread of one run is alive during the next.
Each run's answer must carry a token drawn from the kernel's random source when that run starts
(and bytes left in the runner's pipe are dropped first): a frame the code of an earlier run wrote,
from a thread or its main one, cannot answer for a later run.
"""

from __future__ import annotations

import _thread
import builtins
import contextlib
import linecache
import os
import sys
import types

from . import files, isolation, protocol, runner, seccomp, sysapi

_exit = os._exit
_abandoning = _thread.allocate_lock()
_PROTOCOL = (
    "on (a supervisor process owns the env's pipes; the code runs in its child, which holds none "
    "of them; answers are checked against the run's sequence number and a random token drawn "
    "when the run starts, so nothing written during an earlier run answers for a later one, and "
    "rebuilt; a run that leaves threads running ends with a restart, so none is alive during a "
    "later run)"
)


def _preload(init: dict) -> tuple[dict, set[int]]:
    """The user namespace with the preloaded modules (run here, inherited by the runner)."""
    import _sitebuiltins  # what `site` (skipped by -S for a faster start) would have added

    builtins.help = _sitebuiltins._Helper()
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    for name, path in init["preload"].items():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        module = types.ModuleType(name)
        module.__file__ = path
        sys.modules[name] = module  # registered first, as the import system does
        # the file is not visible from inside: tracebacks and inspect read the source from here
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        exec(compile(source, path, "exec"), module.__dict__)
        namespace[name] = module
    return namespace, {id(namespace[name]) for name in init["preload"]}


def _abandon(workdir: str, child: int | None) -> None:
    """The env is gone: kill the runner, empty the working dir (nobody else will) and exit.

    The watchdog and the main thread may both get here: the first does it, the other waits.
    """
    _abandoning.acquire()
    if child:
        with contextlib.suppress(OSError):  # already dead
            os.kill(child, 9)
        with contextlib.suppress(OSError):  # already reaped by the other thread
            os.waitpid(child, 0)
    with contextlib.suppress(BaseException):  # best effort: exiting matters more
        files.remove_tree(workdir, keep_top=True)
    _exit(1)


def _disconnected(parent_pid: int, workdir: str, child: int | None) -> None:
    """The env's pipe broke: if the env died, abandon; if it is alive it is killing us anyway."""
    import time

    deadline = time.monotonic() + 1.0  # a dying parent closes its fds before we are reparented
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(0.02)
    if os.getppid() != parent_pid:
        _abandon(workdir, child)
    _exit(1)


def _start_orphan_watchdog(parent_pid: int, workdir: str, child: int) -> None:
    """Abandon ship if the env dies (checked every 0.5 s, even while user code runs).

    Not PR_SET_PDEATHSIG: that fires when the parent *thread* that spawned us exits, which
    would kill live sandboxes of envs created in short-lived worker threads.
    """
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        _abandon(workdir, child)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()


def _reap(child: int) -> int | None:
    """The runner's exit code (negative: killed by that signal), waiting up to 1 s; None if it
    is still alive (it closed its pipe itself)."""
    import time

    deadline = time.monotonic() + 1.0
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def _drain(fd: int) -> None:
    """Drop what is waiting in the runner's pipe: an honest runner leaves nothing there between
    runs, so it is what code wrote (a partial frame would otherwise garble the next answer)."""
    os.set_blocking(fd, False)
    try:
        while os.read(fd, 1 << 16):
            pass
    except BlockingIOError:  # empty
        pass
    except OSError:  # the runner is gone: reading its pipe again says how
        pass
    finally:
        os.set_blocking(fd, True)


def _await_result(fd: int, run: tuple[int, str], cap: int, child: int) -> dict:
    """The runner's answer to ``run`` (its sequence number and token); forged or stale frames,
    those without the run's token, are dropped."""
    seq, token = run
    max_size = protocol.max_result_size(cap)
    while True:
        try:
            msg = protocol.recv(fd, max_size)
        except protocol.Malformed as exc:
            why = f"it wrote a malformed frame ({exc}) to the sandbox's result channel"
            return {"op": "died", "why": why}
        except OSError:
            msg = None
        if msg is None:
            code = _reap(child)
            if code is None:
                return {"op": "died", "why": "it closed its connection to the supervisor"}
            return {"op": "died", "code": code}
        clean = protocol.clean_result(msg, seq, cap) if msg.get("token") == token else None
        if clean is not None:
            return clean


def _threads_left(child: int) -> bool:
    """Whether the runner has threads besides its main one, waiting up to 1 s for those that
    are ending (a thread joined a moment ago may not have exited yet); True if unreadable."""
    import time

    deadline = time.monotonic() + 1.0
    while True:
        try:
            count = len(os.listdir(f"/proc/{child}/task"))
        except OSError:
            return True
        if count == 1:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.001)


def _layers_from(msg: dict | None) -> dict[str, str] | None:
    layers = msg.get("layers") if msg is not None and msg.get("op") == "ready" else None
    if type(layers) is not dict or not all(type(v) is str for v in layers.values()):
        return None
    return {str(k): v for k, v in layers.items()}


def _check_workdir(init: dict) -> None:
    """The working dir must be the directory the env made (not a link planted at its path).

    Raises:
        OSError: it is not.
    """
    fd = os.open(init["workdir"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if [st.st_dev, st.st_ino] != init["workdir_id"]:
        raise OSError(f"{init['workdir']} is not the working dir the env made")


def _plan_uid(init: dict) -> tuple[int | None, str, int | None]:
    """``(uid to drop to, why uid 0 is kept, uid to map into a user namespace)``."""
    if not init["drop_privileges"] or os.geteuid() != 0:
        return None, "", None  # not root: a user namespace and no capabilities instead
    caps = isolation.effective_capabilities()
    if not (caps & (1 << isolation.CAP_SETUID) and caps & (1 << isolation.CAP_SETGID)):
        return None, "no CAP_SETUID and CAP_SETGID", None
    uid = init["uid_base"] + os.getpid()  # unique among live sandboxes: pids are
    if caps & (1 << isolation.CAP_SYS_ADMIN):
        return uid, "", None  # decided once the view is built (_isolate)
    # the namespaces will need a user namespace, in which root's files are out of reach: the
    # working dir changes hands now and the sandbox's uid is mapped into it
    os.chown(init["workdir"], uid, uid)
    return uid, "", uid


def _isolate(init: dict) -> tuple[dict[str, str], dict, bool]:
    """Namespaces, the view and the uid: ``(layers, what the runner keeps, user namespace?)``."""
    workdir, layers, userns = init["workdir"], {}, False
    _check_workdir(init)  # before root does anything with it
    uid, kept_why, map_id = _plan_uid(init)
    if init["isolate_network"]:
        flags = sysapi.CLONE_NEWNET | sysapi.CLONE_NEWIPC
        err, userns = isolation.enter_namespaces(flags, userns, map_id)
        how = "network and IPC namespaces" + (" in a user namespace" if userns else "")
        on = f"on ({how}: no interface but a loopback that is down)"
        layers["network"] = f"off (unshare failed: {err})" if err else on
    else:
        layers["network"] = "off (disabled)"
    view_reads = None
    if init["private_fs"]:
        err, userns = isolation.enter_namespaces(sysapi.CLONE_NEWNS, userns, map_id)
        if err:
            layers["filesystem"] = f"off (unshare(CLONE_NEWNS) failed: {err})"
        else:
            try:
                layers["filesystem"], view_reads = isolation.build_view(workdir, userns)
            except OSError as exc:
                layers["filesystem"] = f"off (building the view failed: {exc})"
    else:
        layers["filesystem"] = "off (disabled)"
    # without a view, another uid must reach the standard library and the working dir on the host
    stdlib = os.path.dirname(os.__file__)
    readable = view_reads is not None or all(
        isolation.others_can_read(p) for p in (stdlib, os.path.dirname(workdir))
    )
    if uid is not None and not readable:  # no view (unavailable here): the uid could not import
        if map_id is not None:
            os.chown(workdir, 0, 0)  # back to root (uid 0 is mapped in our user namespace too)
        uid, kept_why = None, f"{stdlib} is not readable by other users and there is no view"
    elif uid is not None and map_id is None:
        if userns:  # root's own uid 0 is mapped: the sandbox's uid is not (unexpected)
            uid, kept_why = None, "in a user namespace that maps only uid 0"
        else:
            os.chown(workdir, uid, uid)
    keep = {"uid": uid, "kept_why": kept_why, "view_reads": view_reads, "supervisor": os.getpid()}
    return layers, keep, userns


def main(cmd_fd: int, resp_fd: int) -> None:
    init = protocol.recv_or_none(cmd_fd)
    if init is None or init.get("op") != "init":
        _exit(2)
    parent_pid, workdir = init["parent_pid"], init["workdir"]
    if os.getppid() != parent_pid:  # the env is already gone
        _exit(1)
    namespace, hidden = _preload(init)
    try:
        layers, keep, userns = _isolate(init)
    except OSError as exc:  # fail closed: no sandbox rather than a half-built one
        protocol.send(resp_fd, {"op": "failed", "why": f"isolating the sandbox: {exc}"})
        _exit(1)
    init = {**init, "user_namespace": userns}
    runner_cmd, cmd_w = os.pipe()
    out_r, runner_out = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(cmd_w)
            os.close(out_r)
            runner.main(init, (runner_cmd, runner_out), keep, namespace, hidden)
        finally:
            _exit(1)
    os.close(runner_cmd)
    os.close(runner_out)
    own = _harden_self(init, keep)
    _start_orphan_watchdog(parent_pid, workdir, child)  # after seccomp: a thread is allowed
    msg = protocol.recv_or_none(out_r, 1 << 20)
    runner_layers = _layers_from(msg)
    if runner_layers is None:
        why = msg.get("why") if msg and msg.get("op") == "failed" else None
        why = why or f"the runner exited during its start-up (code {_reap(child)})"
        protocol.send(resp_fd, {"op": "failed", "why": str(why)})
        _exit(1)
    layers.update(runner_layers)
    if own.startswith("off") and layers.get("privileges", "").startswith("on"):
        layers["privileges"] += f"; the supervisor's own drop: {own}"
    layers["protocol"] = _PROTOCOL
    if not layers.get("seccomp", "").startswith("on"):
        layers["protocol"] = _PROTOCOL[:-1] + "; seccomp is off: processes it forks can outlive it)"
    try:
        protocol.send(resp_fd, {"op": "ready", "layers": layers, "runner_pid": child})
    except OSError:
        _disconnected(parent_pid, workdir, child)
    _serve((cmd_fd, resp_fd), (cmd_w, out_r), child, init)


def _harden_self(init: dict, keep: dict) -> str:
    """The supervisor's own lock-down once the runner is forked: same uid, no capabilities, not
    dumpable (the runner cannot read its memory or descriptors), the same seccomp filter."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    own = "off (disabled)"
    if init["drop_privileges"]:
        own = isolation.drop_privileges(keep["uid"], dumpable=False, kept_why=keep["kept_why"])
    else:
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)
    if init["seccomp"]:
        seccomp.install()
    return own


def _serve(env: tuple[int, int], child_fds: tuple[int, int], child: int, init: dict) -> None:
    """Relay cells to the runner and checked answers back, until the env or the runner goes."""
    cmd_fd, resp_fd = env
    to_child, from_child = child_fds
    parent_pid, workdir, cap = init["parent_pid"], init["workdir"], init["cap"]
    while True:
        msg = protocol.recv_or_none(cmd_fd)
        if msg is None or msg.get("op") != "exec" or type(msg.get("seq")) is not int:
            _disconnected(parent_pid, workdir, child)
            return
        seq, token = msg["seq"], os.urandom(16).hex()  # unknown to any code run so far
        _drain(from_child)
        run = {"op": "exec", "seq": seq, "token": token, "code": str(msg.get("code", ""))}
        with contextlib.suppress(OSError):  # the runner is gone: reading its pipe says how
            protocol.send(to_child, run)
        answer = _await_result(from_child, (seq, token), cap, child)
        if answer["op"] == "result" and _threads_left(child):  # they could answer a later run
            with contextlib.suppress(OSError):
                os.kill(child, 9)
            answer["restart"] = "threads left running"
        try:
            protocol.send(resp_fd, answer)
        except OSError:
            _disconnected(parent_pid, workdir, child)
        if answer["op"] == "died" or "restart" in answer:
            _exit(0)  # the runner dies with us (PR_SET_PDEATHSIG); the env starts a new sandbox
