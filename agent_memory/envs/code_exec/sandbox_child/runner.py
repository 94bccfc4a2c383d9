"""The runner: the process that runs user code, like a Jupyter kernel.

Forked by the supervisor after the private view is built, it hardens itself (:func:`harden`) and
answers ``ready``; then it runs each ``exec`` frame's code in one persistent namespace and answers
a ``result`` frame: the captured output, kept as head and tail of at most ``cap`` characters each,
with the frame's ``seq`` and ``token`` (the supervisor accepts no answer without that run's token).
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import sys
import traceback

from . import audit, isolation, landlock, protocol, seccomp, sysapi

_exit = os._exit
_TRACEBACK_LINES = 20
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


class Capture(io.TextIOBase):
    """A text stream that keeps the first and the last ``cap`` characters and counts the rest.

    Example:
        >>> c = Capture(3)
        >>> _ = c.write("abcdefgh"); c.result()
        ('abc', 'fgh', 2)
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head: list[str] = []
        self.tail: list[str] = []
        self.head_len = self.tail_len = self.total = 0

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        self.total += n
        if self.head_len < self.cap:
            taken = s[: self.cap - self.head_len]
            self.head.append(taken)
            self.head_len += len(taken)
            s = s[len(taken) :]
        if s:
            self.tail.append(s)
            self.tail_len += len(s)
            if self.tail_len > 2 * self.cap:  # amortised trimming keeps writes O(1)
                kept = "".join(self.tail)[-self.cap :]
                self.tail, self.tail_len = [kept], len(kept)
        return n

    def result(self) -> tuple[str, str, int]:
        """``(head, tail, omitted)``: the text is ``head + <omitted chars> + tail``."""
        tail = "".join(self.tail)[-self.cap :] if self.tail else ""
        return "".join(self.head), tail, self.total - self.head_len - len(tail)


def _hide_own_frames(te: traceback.TracebackException, seen: set[int] | None = None) -> None:
    """Drop this file's frames (runner, audit hook): the user sees their code and the api."""
    seen = set() if seen is None else seen
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = [f for f in te.stack if os.path.dirname(f.filename) != _OWN_DIR]
    te.stack = traceback.StackSummary.from_list([f for f in frames if f.filename != ast.__file__])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _hide_own_frames(chained, seen)


def _format_exception(exc: BaseException) -> str:
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _hide_own_frames(te)
    lines = "".join(te.format()).splitlines()
    if isinstance(exc, SystemExit):
        lines.append("(SystemExit is ignored: the sandbox keeps running)")
    if len(lines) > _TRACEBACK_LINES:
        cut = len(lines) - _TRACEBACK_LINES
        lines = [f"[{cut} earlier traceback lines omitted]", *lines[-_TRACEBACK_LINES:]]
    return "\n".join(lines) + "\n"


def _type_name(value: object) -> str:
    try:
        return str(type(value).__name__)
    except Exception:  # a metaclass with a hostile __name__
        return "?"


def run(code: str, namespace: dict, step: int | None, cap: int, hidden: set[int]) -> dict:
    """Run one code cell (``step`` names it in tracebacks); the trailing expression's repr is
    printed like in a REPL."""
    out = Capture(cap)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    status = "ok"
    try:
        filename = f"<step {step}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename, "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
        else:
            last = None
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
            if value is not None:
                out.write(repr(value) + "\n")
    except BaseException as exc:  # the user's SystemExit/KeyboardInterrupt too: report, go on
        status = "error"
        try:
            out.write(_format_exception(exc))
        except BaseException:  # e.g. MemoryError while formatting
            out.write(f"{type(exc).__name__} (traceback unavailable)\n")
    finally:
        sys.stdout, sys.stderr = saved
    head, tail, omitted = out.result()
    names = sorted(
        (str(name)[: protocol.MAX_NAME], _type_name(value)[: protocol.MAX_NAME])
        for name, value in list(namespace.items())
        if isinstance(name, str) and not name.startswith("_") and id(value) not in hidden
    )
    return {
        "op": "result",
        "status": status,
        "head": head,
        "tail": tail,
        "omitted": omitted,
        "names": names[: protocol.MAX_NAMES],
    }


def harden(init: dict, keep: dict) -> dict:
    """Lock this process down before any user code runs; returns the layers' states.

    ``keep``: ``uid`` (to drop to, or None), ``kept_why``, ``view_reads`` (the view's paths, or
    None without a view) and ``supervisor`` (its pid).
    """
    workdir, uid, view_reads = init["workdir"], keep["uid"], keep["view_reads"]
    layers: dict[str, str] = {}
    own_uid = uid is not None or init["user_namespace"]  # RLIMIT_NPROC counts per uid
    layers["rlimits"] = isolation.set_limits(init["limits"], nproc=own_uid)
    if init["drop_privileges"]:
        layers["privileges"] = isolation.drop_privileges(uid, True, keep["kept_why"])
    else:
        layers["privileges"] = "off (disabled)"
    # a change of uid or gid clears the parent-death signal: set it again (seccomp then forbids
    # changing it), and make sure the supervisor did not die in between
    sysapi.prctl(sysapi.PR_SET_PDEATHSIG, 9)
    if os.getppid() != keep["supervisor"]:
        _exit(1)
    if init["landlock"]:
        reads = view_reads if view_reads is not None else isolation.host_read_paths()
        layers["landlock"] = landlock.restrict(workdir, [*reads, "/proc/self"])
    else:
        layers["landlock"] = "off (disabled)"
    layers["seccomp"] = seccomp.install() if init["seccomp"] else "off (disabled)"
    sys.addaudithook(audit.make_hook(workdir))  # last: it refuses ctypes
    layers["audit_hook"] = audit.DESCRIPTION
    return layers


def main(init: dict, fds: tuple[int, int], keep: dict, namespace: dict, hidden: set[int]) -> None:
    """The runner's life (in the forked child): harden, answer "ready", run cells until EOF.

    Args:
        init: the parent's init frame (plus ``user_namespace``).
        fds: ``(commands in, answers out)``: the runner's only pipes, to the supervisor.
        keep: ``uid``, ``kept_why``, ``view_reads`` and ``supervisor`` (its pid).
        namespace: the user namespace (``api`` preloaded).
        hidden: ids of preloaded values left out of ``names``.
    """
    cmd_fd, out_fd = fds
    try:
        sysapi.prctl(sysapi.PR_SET_PDEATHSIG, 9)  # SIGKILL: never outlive the supervisor
    except OSError:
        _exit(1)
    if os.getppid() != keep["supervisor"]:
        _exit(1)
    os.closerange(3, min(cmd_fd, out_fd))  # the env's pipes above all
    os.closerange(min(cmd_fd, out_fd) + 1, max(cmd_fd, out_fd))
    os.closerange(max(cmd_fd, out_fd) + 1, 1 << 16)
    sys.argv = [""]
    try:
        layers = harden(init, keep)
    except BaseException as exc:  # report, do not run code half-hardened
        protocol.send(out_fd, {"op": "failed", "why": f"{type(exc).__name__}: {exc}"})
        _exit(1)
    protocol.send(out_fd, {"op": "ready", "layers": layers})
    cap = init["cap"]
    while True:
        msg = protocol.recv_or_none(cmd_fd)
        if msg is None:  # the supervisor is gone (or the code broke our pipe)
            _exit(1)
        seq, token = msg.get("seq"), msg.get("token")
        try:
            answer = run(str(msg.get("code", "")), namespace, seq, cap, hidden)
            answer.update(seq=seq, token=token)
            protocol.send(out_fd, answer)
        except OSError:  # the code closed or broke our pipe
            _exit(1)
        except MemoryError:
            try:
                fallback = {"status": "error", "head": "MemoryError\n", "tail": "", "omitted": 0}
                answer = {"op": "result", "seq": seq, "token": token, **fallback, "names": []}
                protocol.send(out_fd, answer)
            except BaseException:
                _exit(3)  # the supervisor sees EOF and reports the death
